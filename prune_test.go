package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// TestPrune keeps what Prune may remove: nothing the next tap of an action
// needs, judged by the smallest age any clock reports.
func TestPrune(t *testing.T) {
	t.Parallel()

	// A payment succeeds while the device's clock is two days behind; the
	// clock is put right; Prune of what is older than a day keeps it, for
	// it is minutes old by the clock that counts time since boot, and the
	// next tap of the same cart pays nothing.
	t.Run("it judges an outcome by the smallest age any clock reports", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
		t.Cleanup(srv.Close)
		device := newDeviceClock(truth)
		device.Jump(-48 * time.Hour)
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(bootDevice{device}))
		require.NoError(t, err)
		req := payment1500(t, srv)
		_, err = c.Send(ctx, "checkout:behind", req)
		require.NoError(t, err)

		truth.Advance(10 * time.Minute)
		device.Jump(48 * time.Hour) // the network time puts the clock right
		n, err := c.Prune(ctx, 24*time.Hour)
		require.NoError(t, err)
		assert.Zero(t, n, "the outcome is ten minutes old")
		in, err := c.Intent(ctx, "checkout:behind", req)
		require.NoError(t, err)
		require.NotNil(t, in.Response())
		assert.NotEmpty(t, in.Response().Body, "kept whole, not even reduced to a tombstone")
		resp, err := c.Send(ctx, "checkout:behind", req)
		require.NoError(t, err)
		assert.True(t, resp.FromStore)
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})

	// Prune keeps a tombstone of an action's latest payment that succeeded:
	// long after its record would have been pruned, the next tap of the same
	// cart pays nothing, and a changed cart is refused with the earlier
	// answer.
	t.Run("it keeps what makes the next tap of a paid action a no-op", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		req := e.paymentRequest(t, 100, "cus_1")
		first, err := e.client.Send(ctx, "checkout:paid", req)
		require.NoError(t, err)
		_, err = e.client.Send(ctx, "checkout:other", e.paymentRequest(t, 100, "cus_declined"))
		require.Error(t, err, "declined: a final answer, nothing to keep")

		e.clock.Advance(48 * time.Hour)
		n, err := e.client.Prune(ctx, 24*time.Hour)
		require.NoError(t, err)
		assert.Zero(t, n, "each action's latest intent becomes a tombstone, the declined one too")
		for _, name := range []string{"checkout:paid", "checkout:other"} {
			recs, err := e.store.List(ctx, persist.Filter{Name: name})
			require.NoError(t, err)
			require.Len(t, recs, 1)
			assert.True(t, recs[0].Tombstone)
			assert.Nil(t, recs[0].Body, "no bodies in a tombstone")
			assert.Nil(t, recs[0].Response.Body)
		}

		restarted := e.newClient(t)
		resp, err := restarted.Send(ctx, "checkout:paid", req)
		require.NoError(t, err)
		assert.True(t, resp.FromStore)
		assert.Equal(t, first.StatusCode, resp.StatusCode)
		assert.Equal(t, first.Header.Get("Location"), resp.Header.Get("Location"))
		_, err = restarted.Send(ctx, "checkout:paid", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorAs(t, err, new(*idem.ResolvedError))
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)

		// The tombstone's lifetime is bounded.
		e.clock.Advance(idem.TombstoneLifetime)
		n, err = restarted.Prune(ctx, 24*time.Hour)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
	})

	// The tombstones a store keeps are bounded: beyond MaxTombstones the
	// oldest go first.
	t.Run("it bounds the tombstones", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		const extra = 3
		for i := range idem.MaxTombstones + extra {
			at := epoch.Add(time.Duration(i) * time.Second)
			require.NoError(t, persisttest.Put(ctx, e.store, &persist.Record{
				Key: fmt.Sprintf("k%05d", i), Name: fmt.Sprintf("checkout:%d", i), Seq: 1,
				Method: http.MethodPost, URL: "https://api.example.com/payments", Fingerprint: "f",
				CreatedAt: at, UpdatedAt: at, State: persist.StateSucceeded, Tombstone: true,
				Response: &persist.Response{StatusCode: http.StatusCreated},
			}))
		}
		e.clock.Advance(time.Duration(idem.MaxTombstones+extra) * time.Second)
		n, err := e.client.Prune(ctx, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, extra, n)
		for i := range extra {
			_, err := e.store.Get(ctx, fmt.Sprintf("k%05d", i))
			assert.ErrorIs(t, err, persist.ErrNotFound, "the oldest go first")
		}
	})
}

// bootDevice is deviceClock with the clock that counts sleep of the
// Manual beneath it, which no jump of the wall clock moves.
type bootDevice struct {
	*deviceClock
}

func (b bootDevice) SinceBoot() (time.Duration, string, bool) { return b.true.SinceBoot() }
