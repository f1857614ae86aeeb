package idem_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// deferringStore records which writes of which state were durable before
// returning and which were deferred (persist.WithDeferredSync).
type deferringStore struct {
	persist.Store
	mu       sync.Mutex
	durable  []persist.State
	deferred []persist.State
}

func (s *deferringStore) Write(ctx context.Context, rec, old *persist.Record) error {
	s.mu.Lock()
	if persist.DeferredSync(ctx) {
		s.deferred = append(s.deferred, rec.State)
	} else {
		s.durable = append(s.durable, rec.State)
	}
	s.mu.Unlock()
	return s.Store.Write(ctx, rec, old)
}

// TestDurableWrites keeps the durable writes of a tap: as few as a crash
// allows, off the path the user waits on where the server can replay.
func TestDurableWrites(t *testing.T) {
	t.Parallel()

	// The intent is saved durably before its first attempt, and so is an unknown
	// outcome; a final answer, which the server replays to a resumed intent, goes
	// through SaveDeferred, off the path the user waits on.
	t.Run("the intent and an unknown outcome are durable before the user waits on them", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		store := &deferringStore{Store: persist.NewMemory(nil)}
		e.store = store
		c := e.newClient(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))

		// The Pay screen shows the intent: nothing is written yet.
		paid, err := c.Intent(ctx, "checkout:shown", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		assert.Empty(t, store.durable, "an intent the user has not tapped is not written")
		_, err = c.Do(ctx, paid) // the tap
		require.NoError(t, err)
		assert.Equal(t, []persist.State{persist.StateNew}, store.durable, "one durable write for a successful intent: the arming")
		assert.Equal(t, []persist.State{persist.StateSucceeded}, store.deferred)
		store.durable = nil

		oneOff, err := c.NewIntent(ctx, "", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = c.Do(ctx, oneOff)
		require.NoError(t, err)
		assert.Equal(t, []persist.State{persist.StateNew}, store.durable, "one for a one-off intent too")
		assert.Equal(t, []persist.State{persist.StateSucceeded, persist.StateSucceeded}, store.deferred)
		store.deferred = store.deferred[:1]

		declined, err := c.NewIntent(ctx, "", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		_, err = c.Do(ctx, declined)
		require.Error(t, err)
		assert.Equal(t, []persist.State{persist.StateSucceeded, persist.StateFailed}, store.deferred)

		lost, err := c.NewIntent(ctx, "", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: lost.Key(), Count: 2})
		_, err = c.Do(ctx, lost)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Equal(t, []persist.State{persist.StateNew, persist.StateNew, persist.StateNew, persist.StatePending}, store.durable,
			"an unknown outcome is saved durably")
		assert.Len(t, store.deferred, 2)
	})

	// On a clock that moves between the arming write and the call, the tap still
	// writes once. The arming write's send deadline covers the call that follows
	// it.
	t.Run("a tap writes once on a clock that moves", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)
		store := &deferringStore{Store: persist.NewMemory(nil)}
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithStore(store))
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, []persist.State{persist.StateNew}, store.durable, "one durable write for the tap: the arming")
	})
}
