package fakeserver_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/idempotency"
)

// TestOptions proves that the handler uses each option of its clock, ids
// and record store, in place of its own.
func TestOptions(t *testing.T) {
	t.Run("Sleep waits out the processing delay and the delay fault", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		var waits []time.Duration
		s, _ := newServer(t, &fakeserver.Options{ProcessingDelay: 50 * time.Millisecond,
			Sleep: func(ctx context.Context, d time.Duration) error {
				mu.Lock()
				defer mu.Unlock()
				waits = append(waits, d)
				return ctx.Err()
			}})
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDelay, Key: "k2", Delay: 20 * time.Millisecond}))
		assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
		assert.Equal(t, http.StatusCreated, pay(t, s, "k2", otherBody).Status)
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []time.Duration{50 * time.Millisecond, 70 * time.Millisecond}, waits)
	})
	t.Run("Sleep's error is a client gone away", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, &fakeserver.Options{ProcessingDelay: time.Second,
			Sleep: func(context.Context, time.Duration) error { return context.Canceled }})
		a := pay(t, s, "k1", payBody)
		assert.Equal(t, http.StatusServiceUnavailable, a.Status, "%s", a.Body)
		assert.Zero(t, s.Stats().ProviderCharges)
	})
	t.Run("NewID names every payment", func(t *testing.T) {
		t.Parallel()
		n := 0
		s, _ := newServer(t, &fakeserver.Options{NewID: func() string { n++; return "pay_seeded_" + string(rune('0'+n)) }})
		assert.Equal(t, "/payments/pay_seeded_1", pay(t, s, "k1", payBody).Header.Get("Location"))
		assert.Equal(t, "/payments/pay_seeded_2", pay(t, s, "k2", payBody).Header.Get("Location"))
	})
	t.Run("WrapRecords is the store the idempotency layer uses", func(t *testing.T) {
		t.Parallel()
		st := &failingStore{}
		s, _ := newServer(t, &fakeserver.Options{WrapRecords: func(in idempotency.Store) idempotency.Store {
			st.Store = in
			return st
		}})
		assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
		assert.Equal(t, 1, st.inserts, "the layer inserted through the wrapper")
		st.fail = true
		a := pay(t, s, "k2", payBody)
		assert.GreaterOrEqual(t, a.Status, 500, "%s", a.Body)
		assert.Equal(t, 1, s.Stats().ProviderCharges, "nothing was charged under the failed insert")
		// The server's own reads go to the store it wrapped.
		assert.Equal(t, 1, s.Stats().Records)
	})
}

// failingStore counts the inserts it is given, and fails them on demand.
type failingStore struct {
	idempotency.Store
	mu      sync.Mutex
	inserts int
	fail    bool
}

func (s *failingStore) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	s.mu.Lock()
	s.inserts++
	fail := s.fail
	s.mu.Unlock()
	if fail {
		return nil, false, errors.New("the store is down")
	}
	return s.Store.Insert(ctx, rec)
}

// TestCharges: the provider's charges are listed with the requests that
// made them, a dead worker's charge too.
func TestCharges(t *testing.T) {
	t.Run("every charge is listed with its request, a dead worker's too", func(t *testing.T) {
		t.Parallel()
		if os.Getenv(envPostgres) == "1" {
			t.Skip("only memory lists the charges")
		}
		s, _ := newServer(t, nil)
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k1"}))
		_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody, Auth: "Bearer test_ann"})
		require.Error(t, err, "the worker died after the charge")
		assert.Equal(t, http.StatusCreated, send(t, s.Client(), s.URL, req{Key: "k2", Body: otherBody}).Status)

		chs, err := s.Charges()
		require.NoError(t, err)
		require.Len(t, chs, 2)
		assert.Equal(t, fakeserver.Charge{ID: chs[0].ID, Amount: 1500, Currency: "AZN", Customer: "cus_1", CreatedAt: epoch,
			Principal: "Bearer test_ann", Key: "k1", Description: "coffee"}, chs[0])
		assert.Equal(t, "k2", chs[1].Key)
		assert.Equal(t, "tea", chs[1].Description)
		assert.Equal(t, int64(2500), chs[1].Amount)
	})
	t.Run("a reset forgets them", func(t *testing.T) {
		t.Parallel()
		if os.Getenv(envPostgres) == "1" {
			t.Skip("only memory lists the charges")
		}
		s, _ := newServer(t, nil)
		pay(t, s, "k1", payBody)
		fakeserver.Reset(s.Handler)
		chs, err := s.Charges()
		require.NoError(t, err)
		assert.Empty(t, chs)
	})
}
