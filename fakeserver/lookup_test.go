package fakeserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/internal/fakestate"
	"github.com/idemkit/idem/idempotency"
)

// paidBody decodes a payment from a lookup's answer.
func paidBody(tb testing.TB, a answer) (id string, amount int64, description string) {
	tb.Helper()
	var p struct {
		ID          string
		Amount      int64
		Description string
	}
	require.NoError(tb, json.Unmarshal(a.Body, &p), "%s", a.Body)
	return p.ID, p.Amount, p.Description
}

// crashAfterCharge makes the provider charge under key and the worker die
// before anything is recorded.
func crashAfterCharge(t *testing.T, s *fakeserver.Server, key string) {
	t.Helper()
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: key}))
	_, err := trySend(freshClient(t), s.URL, req{Key: key, Body: payBody})
	require.Error(t, err, "the worker should have died without answering")
}

// processes starts n fake servers on one database and one clock, as n
// processes of cmd/fakeserver -postgres would be; each is closed when t ends
// unless the test closes it first.
func processes(t *testing.T, n int, retention time.Duration) ([]*fakeserver.Server, *clock.Manual) {
	t.Helper()
	pool := newPool(t)
	clk := clock.NewManual(epoch)
	out := make([]*fakeserver.Server, n)
	for i := range out {
		s := fakeserver.NewServer(&fakeserver.Options{Storage: onPostgres(pool), Clock: clk, Retention: retention})
		t.Cleanup(s.Close)
		out[i] = s
	}
	return out, clk
}

// TestLookupNeverLosesADeadProcessesCharge: on PostgreSQL, a worker in one
// process charges the provider and the process dies. Past the lease and the
// retention, the lookup in another process, and in a process started
// afterwards, finds the charge: the intent to charge is in the database, not
// in the memory of the process that made it. A 404 here makes a client pay
// again.
func TestLookupNeverLosesADeadProcessesCharge(t *testing.T) {
	t.Parallel()
	ps, clk := processes(t, 3, time.Hour)
	crashAfterCharge(t, ps[0], "k1")
	ps[0].Close() // the process dies, and what it kept in memory with it
	clk.Advance(time.Hour)

	for i, s := range ps[1:] {
		a := lookup(t, s, "k1")
		require.Equal(t, http.StatusOK, a.Status, "process %d: %s", i+1, a.Body)
		_, amount, description := paidBody(t, a)
		assert.Equal(t, int64(1500), amount)
		assert.Equal(t, "coffee", description)
	}
	st := ps[1].Stats()
	assert.Equal(t, 1, st.Payments, "the charge is a payment")
	assert.Equal(t, 1, st.ProviderCharges)
}

// TestSweepRecordsADeadWorkersChargeBeforeDeletingItsRecord: the sweep, in
// any process, asks the provider about an expired IN_PROGRESS record's
// stable id before deleting the record, and records what was charged: it
// never deletes a charge's only trace.
func TestSweepRecordsADeadWorkersChargeBeforeDeletingItsRecord(t *testing.T) {
	t.Parallel()
	t.Run("in memory", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		s := start(t, &fakeserver.Options{Clock: clk, Retention: time.Hour})
		sweepAfterCrash(t, s, s, clk)
	})
	t.Run("another process on PostgreSQL", func(t *testing.T) {
		t.Parallel()
		ps, clk := processes(t, 2, time.Hour)
		sweepAfterCrash(t, ps[0], ps[1], clk)
	})
}

func sweepAfterCrash(t *testing.T, dying, sweeper *fakeserver.Server, clk *clock.Manual) {
	crashAfterCharge(t, dying, "k1")
	if dying != sweeper {
		dying.Close()
	}
	clk.Advance(time.Hour)
	assert.Equal(t, 1, sweeper.Sweep())
	st := sweeper.Stats()
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Requests: 1}, st,
		"the sweep recorded the charge and deleted the record")
	a := lookup(t, sweeper, "k1")
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Body)
}

// TestLookupRecoversADeadWorkersChargeWithinTheLease: once the lease of a
// dead worker's record ends, the lookup asks the provider by the record's
// stable id, as a takeover does, and answers the payment, which a resend
// then replays; it does not answer 409 until the record expires.
func TestLookupRecoversADeadWorkersChargeWithinTheLease(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, nil)
	crashAfterCharge(t, s, "k1")
	a := lookup(t, s, "k1")
	require.Equal(t, http.StatusConflict, a.Status, "the lease is alive: the worker may still finish")

	clk.Advance(fakeserverLease)
	a = lookup(t, s, "k1")
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Body)
	_, amount, description := paidBody(t, a)
	assert.Equal(t, int64(1500), amount)
	assert.Equal(t, "coffee", description)
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, Requests: 3}, s.Stats(),
		"recorded once, charged once, the record settled")

	resent := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusCreated, resent.Status)
	assert.Equal(t, "true", resent.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(a.Body), string(resent.Body), "the resend replays the payment the lookup found")
	assert.Equal(t, string(a.Body), string(lookup(t, s, "k1").Body))
	assert.Equal(t, 1, s.Stats().ProviderCharges)
}

// TestLookupOfAKeyReusedAfterRetentionAnswersTheNewRequest: a key used
// again after its record expired is a new intent; the lookup answers for
// it (409 while it runs, its payment after, 404 when it was declined),
// never with the payment the key made before.
func TestLookupOfAKeyReusedAfterRetentionAnswersTheNewRequest(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		run  func(t *testing.T, s *fakeserver.Server, clk *clock.Manual) (status int, id string)
	}{
		{"while the new request runs", func(t *testing.T, s *fakeserver.Server, _ *clock.Manual) (int, string) {
			require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert, Key: "k1"}))
			_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: otherBody})
			require.Error(t, err)
			return http.StatusConflict, ""
		}},
		{"after it completes", func(t *testing.T, s *fakeserver.Server, _ *clock.Manual) (int, string) {
			a := pay(t, s, "k1", otherBody)
			require.Equal(t, http.StatusCreated, a.Status)
			id, _, _ := paidBody(t, a)
			return http.StatusOK, id
		}},
		{"after it was declined", func(t *testing.T, s *fakeserver.Server, _ *clock.Manual) (int, string) {
			require.Equal(t, http.StatusPaymentRequired, pay(t, s, "k1", declineBody).Status)
			return http.StatusNotFound, ""
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, clk := newServer(t, &fakeserver.Options{Retention: time.Hour})
			first := pay(t, s, "k1", payBody)
			require.Equal(t, http.StatusCreated, first.Status)
			oldID, _, _ := paidBody(t, first)
			clk.Advance(time.Hour)

			status, newID := c.run(t, s, clk)
			a := lookup(t, s, "k1")
			require.Equal(t, status, a.Status, "%s", a.Body)
			assert.NotContains(t, string(a.Body), oldID, "the lookup answered the key's old payment")
			if newID != "" {
				id, _, _ := paidBody(t, a)
				assert.Equal(t, newID, id)
			}
		})
	}
}

// TestLookupNeverLosesTheChargeOfARecordWithoutAnIntent: a record written
// before intents to charge were recorded (a database migrated while a
// worker's charge was unsettled) has no row in fake_intents, but its
// stable id is the provider's key all the same. Once the record has
// expired, before and after a sweep, the lookup must still find the charge
// its dead worker made: a 404 makes the client void an intent that was
// paid.
func TestLookupNeverLosesTheChargeOfARecordWithoutAnIntent(t *testing.T) {
	t.Parallel()
	for _, sweep := range []bool{false, true} {
		t.Run(map[bool]string{false: "expired", true: "swept"}[sweep], func(t *testing.T) {
			t.Parallel()
			pool := newPool(t)
			clk := clock.NewManual(epoch)
			s := start(t, &fakeserver.Options{Storage: onPostgres(pool), Clock: clk, Retention: time.Hour})
			crashAfterCharge(t, s, "k1")
			_, err := pool.Exec(context.Background(), "DELETE FROM fake_intents") // as before intents were recorded
			require.NoError(t, err)
			clk.Advance(time.Hour)
			if sweep {
				assert.Equal(t, 1, s.Sweep())
			}

			a := lookup(t, s, "k1")
			require.Equal(t, http.StatusOK, a.Status, "the provider holds the charge: %s", a.Body)
			_, amount, _ := paidBody(t, a)
			assert.Equal(t, int64(1500), amount)
			st := s.Stats()
			assert.Equal(t, 1, st.Payments, "the charge is a payment")
			assert.Equal(t, 1, st.ProviderCharges)
		})
	}
}

// TestLookupOfAKeyReusedAfterRetentionAnswersTheNewRequestAfterItExpires:
// a key paid, expired, and was used again for a payment that was declined.
// Once the new record has expired too, swept or not, the lookup still
// answers for the key's latest intent (nothing was charged for it), in
// memory as on PostgreSQL: never the payment of the key's first life.
func TestLookupOfAKeyReusedAfterRetentionAnswersTheNewRequestAfterItExpires(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"in memory", "on PostgreSQL"} {
		for _, sweep := range []bool{false, true} {
			t.Run(where+map[bool]string{false: "", true: ", swept"}[sweep], func(t *testing.T) {
				t.Parallel()
				opts := &fakeserver.Options{Retention: time.Hour}
				if where == "on PostgreSQL" {
					opts.Storage = onPostgres(newPool(t))
				}
				clk := clock.NewManual(epoch)
				opts.Clock = clk
				s := start(t, opts)
				first := pay(t, s, "k1", payBody)
				require.Equal(t, http.StatusCreated, first.Status)
				oldID, _, _ := paidBody(t, first)
				clk.Advance(time.Hour)
				require.Equal(t, http.StatusPaymentRequired, pay(t, s, "k1", declineBody).Status)
				clk.Advance(time.Hour)
				if sweep {
					s.Sweep()
				}

				a := lookup(t, s, "k1")
				assert.Equal(t, http.StatusNotFound, a.Status, "%s", a.Body)
				assert.NotContains(t, string(a.Body), oldID, "the lookup answered the key's old payment")
			})
		}
	}
}

// TestLookupEchoesItsNonce keeps the lookup's marks: every answer echoes
// the key and the lookup's nonce, so that a client tells a miss made for
// its lookup from one a cache kept.
func TestLookupEchoesItsNonce(t *testing.T) {
	t.Parallel()
	s := fakeserver.NewServer(&fakeserver.Options{Clock: clock.NewManual(epoch)})
	t.Cleanup(s.Close)
	lookup := func(key, nonce string) *http.Response {
		r, err := http.NewRequest(http.MethodGet, s.URL+"/payments?idempotency_key="+key, nil)
		require.NoError(t, err)
		r.Header.Set(idempotency.LookupNonceHeader, nonce)
		resp, err := s.Client().Do(r)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}

	t.Run("every answer echoes the lookup's nonce", func(t *testing.T) {
		miss := lookup("k-unused", "n0nce-1")
		assert.Equal(t, http.StatusNotFound, miss.StatusCode)
		assert.Equal(t, []string{"n0nce-1"}, miss.Header.Values(idempotency.LookupNonceHeader))
		assert.Equal(t, "no-store", miss.Header.Get("Cache-Control"))

		_, err := trySend(freshClient(t), s.URL, req{Key: "k-paid", Body: payBody})
		require.NoError(t, err)
		paid := lookup("k-paid", "n0nce-2")
		assert.Equal(t, http.StatusOK, paid.StatusCode)
		assert.Equal(t, []string{"n0nce-2"}, paid.Header.Values(idempotency.LookupNonceHeader))
	})

	t.Run("a nonce that is not visible ASCII or is too long is not echoed", func(t *testing.T) {
		for _, n := range []string{"a b", strings.Repeat("n", 129)} {
			resp := lookup("k-unused", n)
			assert.Empty(t, resp.Header.Values(idempotency.LookupNonceHeader), "%q", n)
		}
	})
}

// failingState is a fake server's state whose record reads fail with err.
// Only the reads the lookup makes first are implemented.
type failingState struct {
	fakestate.State
	err error
}

func (f failingState) Record(context.Context, idempotency.ID, time.Time) (*idempotency.Record, bool, error) {
	return nil, false, f.err
}

func (f failingState) Count(context.Context, fakestate.Counter) error { return nil }

func (f failingState) Records() idempotency.Store { return &idempotency.MemoryStore{} }

type failingStorage struct{ err error }

func (f failingStorage) Open(clock.Clock) fakestate.State { return failingState{err: f.err} }

// failing is a fakeserver.Storage whose record reads fail with err.
func failing(err error) fakeserver.Storage {
	return fakestate.Public(failingStorage{err: err}).(fakeserver.Storage)
}

// TestLookupOfAStoreThatCannotDecide: a store that reached a standby, or
// got no answer from its database in time, cannot say what was done under
// the key. The lookup answers 503 with Retry-After, as a POST does then, so
// the client asks again; never a 500, and never a 404.
func TestLookupOfAStoreThatCannotDecide(t *testing.T) {
	t.Parallel()
	for name, err := range map[string]error{
		"a standby":              fmt.Errorf("pgstore: get key: %w", idempotency.ErrUnavailable),
		"no answer within bound": fmt.Errorf("pgstore: get key: no answer: %w", context.DeadlineExceeded),
	} {
		t.Run("a store that reached "+name+" answers 503 with Retry-After", func(t *testing.T) {
			s := start(t, &fakeserver.Options{Storage: failing(err), Clock: clock.NewManual(epoch)})
			r, rerr := http.NewRequest(http.MethodGet, s.URL+"/payments?idempotency_key=k-any", nil)
			require.NoError(t, rerr)
			resp, rerr := s.Client().Do(r)
			require.NoError(t, rerr)
			resp.Body.Close()
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		})
	}
	t.Run("any other failure of the store is a 500", func(t *testing.T) {
		s := start(t, &fakeserver.Options{Storage: failing(errors.New("disk on fire")), Clock: clock.NewManual(epoch)})
		resp, err := s.Client().Get(s.URL + "/payments?idempotency_key=k-any")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	})
}

func TestLookup(t *testing.T) {
	t.Parallel()
	// An app order under the key is work done.
	t.Run("a key that did other work is never called unused", func(t *testing.T) {
		t.Parallel()
		createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ord_1"}`)
		})
		s := fakeserver.NewServer(&fakeserver.Options{
			Endpoints: []fakeserver.Endpoint{{Pattern: "POST /orders", Handler: createOrder}},
		})
		t.Cleanup(s.Close)
		const key = "order-looked-up-1"
		st, _, _, err := rtPost(s.Client(), s.URL+"/orders", key, `{"sku":"tea"}`)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, st)

		r, _ := http.NewRequest(http.MethodGet, s.URL+"/payments?idempotency_key="+key, nil)
		r.Header.Set("Authorization", "Bearer test_acme_1")
		r.Header.Set("Idempotency-Lookup-Nonce", "n-1")
		resp, err := s.Client().Do(r)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("lookup: %d key=%q nonce=%q %s", resp.StatusCode, resp.Header.Get("Idempotency-Key"),
			resp.Header.Get("Idempotency-Lookup-Nonce"), body)
		require.NotContains(t, string(body), "idempotency-key-unused",
			"the lookup says nothing was done under %s, where an order was made", key)
	})
}
