package fakeserver_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/idempotency"
)

// One test per fault of section 9.

func TestFaultDropResponse(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: "k1"}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err, "the client must see the lost response as an error")
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, Requests: 1}, s.Stats(),
		"the work was done and committed")

	a := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusCreated, a.Status)
	assert.Equal(t, "true", a.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, s.Stats().ProviderCharges)
}

func TestFaultDelay(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDelay, Delay: 300 * time.Millisecond}))
	var wg sync.WaitGroup
	var first answer
	wg.Go(func() { first = pay(t, s, "k1", payBody) })
	require.Eventually(t, func() bool { return s.Stats().InProgress == 1 }, 10*time.Second, time.Millisecond)
	// The delay holds the work before it commits.
	assert.Zero(t, s.Stats().Payments)
	conflict := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusConflict, conflict.Status)
	assert.NotEmpty(t, conflict.Header.Get("Retry-After"))
	wg.Wait()
	assert.Equal(t, http.StatusCreated, first.Status)
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, Requests: 2}, s.Stats())
}

func TestFaultCrashAfterInsert(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert, Path: "/payments"}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err)
	assert.Equal(t, fakeserver.Stats{Records: 1, InProgress: 1, Requests: 1}, s.Stats(), "the record is left behind")

	assert.Equal(t, http.StatusConflict, pay(t, s, "k1", payBody).Status)
	clk.Advance(fakeserverLease)
	assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, Requests: 3}, s.Stats())
}

// fakeserverLease is the default lease.
const fakeserverLease = 30 * time.Second

func TestFaultCrashAfterProvider(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: `"k1"`}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err)
	assert.Equal(t, fakeserver.Stats{ProviderCharges: 1, Executions: 1, Records: 1, InProgress: 1, Requests: 1}, s.Stats(),
		"charged, nothing recorded")

	assert.Equal(t, http.StatusConflict, pay(t, s, "k1", payBody).Status)
	clk.Advance(fakeserverLease)
	a := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusCreated, a.Status)
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 2, Records: 1, Requests: 3}, s.Stats(),
		"the takeover asked the provider and did not charge again")
	b := pay(t, s, "k1", payBody)
	assert.Equal(t, a.Body, b.Body)
}

func TestFaultError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		r    req
	}{
		{"payment", req{Key: "k1", Body: payBody}},
		{"order", req{Method: http.MethodPut, Path: "/orders/1/status", NoKey: true, Body: `{"status":"SHIPPED"}`}},
		{"read", req{Method: http.MethodGet, NoKey: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newServer(t, nil)
			require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError}))
			a := send(t, s.Client(), s.URL, tt.r)
			assert.Equal(t, http.StatusInternalServerError, a.Status)
			assert.Equal(t, fakeserver.ProblemInjectedFault, a.problem(t).Type)
			st := s.Stats()
			assert.Zero(t, st.Records)
			assert.Zero(t, st.ProviderCharges)
			assert.Zero(t, st.Payments)
			assert.Less(t, send(t, s.Client(), s.URL, tt.r).Status, 300, "the fault was used up")
		})
	}
}

func TestFaultStatus(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 503, RetryAfter: "7", Count: 2}))
	for range 2 {
		a := pay(t, s, "k1", payBody)
		assert.Equal(t, http.StatusServiceUnavailable, a.Status)
		assert.Equal(t, "7", a.Header.Get("Retry-After"))
	}
	assert.Equal(t, fakeserver.Stats{Requests: 2}, s.Stats(), "touches nothing")
	assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
}

func TestFaultReset(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultReset}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err)
	assert.Equal(t, fakeserver.Stats{Requests: 1}, s.Stats())
	assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
}

func TestFaultMatching(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fault fakeserver.Fault
		hit   []req
		miss  []req
	}{
		{
			name:  "by key, bare or quoted",
			fault: fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 502, Key: "k1", Count: 2},
			hit:   []req{{Key: `"k1"`, Body: payBody}, {Key: "k1", Body: payBody}},
			miss:  []req{{Key: "k2", Body: payBody}},
		},
		{
			name:  "by path",
			fault: fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 502, Path: "/orders/1/status"},
			hit:   []req{{Method: http.MethodPut, Path: "/orders/1/status", NoKey: true, Body: `{"status":"X"}`}},
			miss:  []req{{Key: "k2", Body: payBody}},
		},
		{
			name:  "by key and path",
			fault: fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 502, Path: "/payments", Key: "k1"},
			hit:   []req{{Key: "k1", Body: payBody}},
			miss:  []req{{Key: "k1", Path: "/orders/1/status", Method: http.MethodPut, Body: `{"status":"X"}`}, {Key: "k2", Body: payBody}},
		},
		{
			name:  "counted down",
			fault: fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 502, Count: 3},
			hit:   []req{{Key: "a", Body: payBody}, {Key: "b", Body: payBody}, {Key: "c", Body: payBody}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newServer(t, nil)
			require.NoError(t, s.InjectFault(tt.fault))
			for _, r := range tt.miss {
				assert.Less(t, send(t, s.Client(), s.URL, r).Status, 300, "%+v must not match", r)
			}
			for _, r := range tt.hit {
				assert.Equal(t, http.StatusBadGateway, send(t, s.Client(), s.URL, r).Status, "%+v must match", r)
			}
			// Used up.
			assert.Equal(t, http.StatusCreated, pay(t, s, "fresh", payBody).Status)
		})
	}
}

func TestClearFaults(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 500, Count: 5}))
	s.ClearFaults()
	assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
}

func TestInjectFaultRejectsBadFaults(t *testing.T) {
	t.Parallel()
	h := fakeserver.NewHandler(nil)
	tests := []struct {
		name  string
		fault fakeserver.Fault
		err   error
		msg   string
	}{
		{"unknown kind", fakeserver.Fault{Kind: "explode"}, fakeserver.ErrUnknownFault, "drop_response, delay, crash_after_insert, crash_after_provider, error, status, reset"},
		{"delay without delay", fakeserver.Fault{Kind: fakeserver.FaultDelay}, fakeserver.ErrInvalidFault, "positive delay"},
		{"status out of range", fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 99}, fakeserver.ErrInvalidFault, "200 to 599"},
		{"negative count", fakeserver.Fault{Kind: fakeserver.FaultError, Count: -1}, fakeserver.ErrInvalidFault, "negative"},
		{"invalid key", fakeserver.Fault{Kind: fakeserver.FaultError, Key: "a b"}, fakeserver.ErrInvalidFault, "key"},
		{"relative path", fakeserver.Fault{Kind: fakeserver.FaultError, Path: "payments"}, fakeserver.ErrInvalidFault, "must start with /"},
		{"retry_after with newline", fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 503, RetryAfter: "1\r\nX: y"}, fakeserver.ErrInvalidFault, "printable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := h.InjectFault(tt.fault)
			require.ErrorIs(t, err, tt.err)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestReset(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError}))
	fakeserver.Reset(s.Handler)
	assert.Equal(t, fakeserver.Stats{}, s.Stats())
	a := pay(t, s, "k1", otherBody)
	assert.Equal(t, http.StatusCreated, a.Status, "records and faults are gone")
}

// TestLookupAfterCrashAfterProviderIsNotNotFound: the provider holds a
// charge the server has not recorded. The lookup by key must not answer 404,
// which a reconciling client takes as "never done" and pays again under a
// new key; it answers 409 while the dead worker's lease is alive, and a
// resend with the key after it settles it.
func TestLookupAfterCrashAfterProviderIsNotNotFound(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k1"}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err)

	lookup := req{Method: http.MethodGet, Path: "/payments?idempotency_key=k1", NoKey: true}
	for _, wait := range []time.Duration{0, fakeserverLease - time.Second} {
		clk.Advance(wait)
		a := send(t, s.Client(), s.URL, lookup)
		assert.Equal(t, http.StatusConflict, a.Status, "after %s", wait)
		assert.Equal(t, fakeserver.ProblemRequestInProgress, a.problem(t).Type)
		assert.NotEmpty(t, a.Header.Get("Retry-After"))
	}

	clk.Advance(time.Second)
	created := pay(t, s, "k1", payBody)
	require.Equal(t, http.StatusCreated, created.Status)
	a := send(t, s.Client(), s.URL, lookup)
	assert.Equal(t, http.StatusOK, a.Status)
	assert.Equal(t, created.Body, a.Body)
	assert.Equal(t, 1, s.Stats().ProviderCharges)
}

// TestFailedTakeoverKeepsTheStableID: a worker charged the provider and
// died; the request that takes its record over fails with a 500. The record
// must survive with its stable id, so the next request asks the provider
// and records the dead worker's charge instead of charging again.
func TestFailedTakeoverKeepsTheStableID(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k1"}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err)
	clk.Advance(fakeserverLease)

	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError, Key: "k1"}))
	assert.Equal(t, http.StatusInternalServerError, pay(t, s, "k1", payBody).Status)
	assert.Equal(t, 1, s.Stats().InProgress, "the record stays, lease ended")

	a := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusCreated, a.Status, "taken over again at once")
	st := s.Stats()
	assert.Equal(t, 1, st.Payments)
	assert.Equal(t, 1, st.ProviderCharges, "the dead worker's charge, not a second one")
}

// TestInjectFaultBoundsPendingFaults: at most MaxFaults faults wait at
// once, through the API and the admin endpoint; clearing makes room.
func TestInjectFaultBoundsPendingFaults(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	for range fakeserver.MaxFaults {
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError, Key: "k1"}))
	}
	assert.ErrorIs(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError}), fakeserver.ErrTooManyFaults)
	a := send(t, s.Client(), s.URL, req{Path: "/_fake/faults", NoKey: true, Body: `{"fault":"error"}`})
	assert.Equal(t, http.StatusServiceUnavailable, a.Status)
	assert.Equal(t, fakeserver.ProblemStorageFull, a.problem(t).Type)
	s.ClearFaults()
	assert.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError}))
	err := s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError, Path: "/" + strings.Repeat("p", 2048)})
	assert.ErrorIs(t, err, fakeserver.ErrInvalidFault, "a path over 2048 bytes")
}

// TestLookupNeverSaysNotFoundForAChargeAfterItsRecordExpired: a worker
// charged the provider and died, and no resend settled it before the
// record's retention ended (the client stops resending before that, and
// reconciles instead). The lookup must still find the charge, before and
// after a sweep: a 404 makes the client void an intent that was paid.
func TestLookupNeverSaysNotFoundForAChargeAfterItsRecordExpired(t *testing.T) {
	t.Parallel()
	for _, sweep := range []bool{false, true} {
		s, clk := newServer(t, &fakeserver.Options{Retention: time.Hour})
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k1"}))
		_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
		require.Error(t, err)
		clk.Advance(time.Hour)
		if sweep {
			s.Sweep()
		}

		a := send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=k1", NoKey: true})
		require.Equal(t, http.StatusOK, a.Status, "swept: %v: %s", sweep, a.Body)
		var p struct {
			Amount      int64
			Description string
		}
		require.NoError(t, json.Unmarshal(a.Body, &p))
		assert.Equal(t, int64(1500), p.Amount)
		assert.Equal(t, "coffee", p.Description)
		st := s.Stats()
		assert.Equal(t, 1, st.Payments, "the charge is a payment")
		assert.Equal(t, 1, st.ProviderCharges)
	}
}

// A rule of package fault picks requests as no Fault can: by method, by
// the request's number, by a seeded chance.
func TestInjectRule(t *testing.T) {
	t.Parallel()
	t.Run("a rule picks the request by its number", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, nil)
		require.NoError(t, s.InjectRule(&fault.Rule{When: fault.Attempt(2), Effect: fault.Effect{Kind: fakeserver.FaultStatus, Status: 503}}))
		assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
		assert.Equal(t, http.StatusServiceUnavailable, pay(t, s, "k2", payBody).Status)
		assert.Equal(t, http.StatusCreated, pay(t, s, "k3", payBody).Status)
	})
	t.Run("a seeded chance faults the same requests on every run", func(t *testing.T) {
		t.Parallel()
		statuses := func() []int {
			s, _ := newServer(t, nil)
			require.NoError(t, s.InjectRule(&fault.Rule{
				When:   fault.And(fault.Method(http.MethodPost), fault.Chance(0.5, fault.Seeded(3))),
				Effect: fault.Effect{Kind: fakeserver.FaultError},
			}))
			var out []int
			for i := range 20 {
				out = append(out, pay(t, s, "k"+strconv.Itoa(i), payBody).Status)
			}
			return out
		}
		first := statuses()
		assert.Equal(t, first, statuses())
		assert.Contains(t, first, http.StatusInternalServerError)
		assert.Contains(t, first, http.StatusCreated)
	})
	t.Run("a status rule answers its own header and body", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, nil)
		page := []byte("<html><h1>404 Not Found</h1>nginx</html>")
		require.NoError(t, s.InjectRule(&fault.Rule{When: fault.Query("idempotency_key"), Effect: fault.Effect{
			Kind: fakeserver.FaultStatus, Status: http.StatusNotFound, Header: http.Header{"Content-Type": {"text/html"}}, Body: page}}))
		a := send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=k1", NoKey: true})
		assert.Equal(t, http.StatusNotFound, a.Status)
		assert.Equal(t, "text/html", a.Header.Get("Content-Type"))
		assert.Equal(t, string(page), string(a.Body))
		assert.Empty(t, a.Header.Get("Idempotency-Key"), "the box in front echoes nothing")
	})
	t.Run("a rule whose effect is not a fault is refused", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, nil)
		assert.ErrorIs(t, s.InjectRule(&fault.Rule{Effect: fault.Effect{Kind: fault.Hold}}), fakeserver.ErrUnknownFault)
		assert.ErrorIs(t, s.InjectRule(&fault.Rule{Effect: fault.Effect{Kind: fault.Delay}}), fakeserver.ErrInvalidFault)
		assert.ErrorIs(t, s.InjectRule(nil), fakeserver.ErrInvalidFault)
		assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status, "nothing was added")
	})
	t.Run("a drawn effect that is not a fault is dropped", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, nil)
		require.NoError(t, s.InjectRule(&fault.Rule{Draw: func(fault.Op) fault.Effect {
			return fault.Effect{Kind: fakeserver.FaultStatus} // no status to answer
		}}))
		assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	})
	t.Run("rules and faults share the bound", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, nil)
		for range fakeserver.MaxFaults {
			require.NoError(t, s.InjectRule(&fault.Rule{When: fault.Key("other"), Effect: fault.Effect{Kind: fakeserver.FaultReset}}))
		}
		assert.ErrorIs(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultReset}), fakeserver.ErrTooManyFaults)
		assert.ErrorIs(t, s.InjectRule(&fault.Rule{Effect: fault.Effect{Kind: fakeserver.FaultReset}}), fakeserver.ErrTooManyFaults)
	})
	// A client checks each payment with two GETs.
	t.Run("the documented every third POST rule counts POSTs only", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(nil)
		t.Cleanup(s.Close)
		require.NoError(t, s.InjectRule(&fault.Rule{
			When:   fault.And(fault.Method(http.MethodPost), func(op fault.Op) bool { return op.Attempt%3 == 0 }),
			Effect: fault.Effect{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, RetryAfter: "1"},
		}))
		refused := 0
		for i := range 6 {
			st, h, _, err := rtPost(s.Client(), s.URL+"/payments", "every-third-"+strconv.Itoa(i), payBody)
			require.NoError(t, err)
			if st == http.StatusServiceUnavailable {
				refused++
				continue
			}
			require.Equal(t, http.StatusCreated, st)
			for _, path := range []string{h.Get("Location"), "/payments"} {
				r, _ := http.NewRequest(http.MethodGet, s.URL+path, nil)
				r.Header.Set("Authorization", "Bearer test_acme_1")
				resp, err := s.Client().Do(r)
				require.NoError(t, err)
				resp.Body.Close()
			}
		}
		require.Equal(t, 2, refused, "of 6 POSTs, %d were answered 503 by the 'every third POST' rule", refused)
	})
	t.Run("after a reset the requests are numbered from 1 again", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(nil)
		t.Cleanup(s.Close)
		for i := range 2 {
			_, _, _, err := rtPost(s.Client(), s.URL+"/payments", "before-reset-"+strconv.Itoa(i), payBody)
			require.NoError(t, err)
		}
		resp, err := s.Client().Post(s.URL+"/_fake/reset", "", nil)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 0, s.Stats().Requests)

		require.NoError(t, s.InjectRule(&fault.Rule{When: fault.Attempt(1), Times: 1,
			Effect: fault.Effect{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable}}))
		st, _, _, err := rtPost(s.Client(), s.URL+"/payments", "after-reset-1", payBody)
		require.NoError(t, err)
		require.Equal(t, 1, s.Stats().Requests)
		require.Equal(t, http.StatusServiceUnavailable, st, "request 1 after the reset was not struck by Attempt(1)")
	})
	t.Run("a rule of negative times is refused", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(nil)
		t.Cleanup(s.Close)
		err := s.InjectRule(&fault.Rule{Times: -1, Effect: fault.Effect{Kind: fakeserver.FaultDropResponse}})
		if err == nil {
			lost := 0
			for i := range 3 {
				if _, _, _, err := rtPost(s.Client(), s.URL+"/payments", "neg-times-"+strconv.Itoa(i), payBody); err != nil {
					lost++
				}
			}
			t.Logf("answers lost: %d of 3, payments made: %d", lost, s.Stats().Payments)
		}
		require.Error(t, err, "a rule of -1 times was taken")
	})
}

func TestFaults(t *testing.T) {
	t.Parallel()
	t.Run("a delay at or over the lease is refused", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, &fakeserver.Options{Lease: 10 * time.Second, ProcessingDelay: time.Second})
		over := fakeserver.Fault{Kind: fakeserver.FaultDelay, Delay: 9 * time.Second}
		assert.ErrorIs(t, s.InjectFault(over), fakeserver.ErrInvalidFault)
		assert.ErrorIs(t, s.InjectRule(&fault.Rule{Effect: fault.Effect{Kind: fakeserver.FaultDelay, Delay: time.Hour}}),
			fakeserver.ErrInvalidFault)
		a := send(t, s.Client(), s.URL, req{Path: "/_fake/faults", NoKey: true, Body: `{"fault":"delay","delay_ms":9000}`})
		assert.Equal(t, http.StatusBadRequest, a.Status)
		assert.Contains(t, string(a.Body), "shorter than the lease")
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDelay, Delay: 8 * time.Second, Key: "other"}))
	})
	t.Run("a delay fault never runs the work twice", func(t *testing.T) {
		t.Parallel()
		// The delay is real time; the lease ends on the shared clock.
		var runs atomic.Int32
		var mu sync.Mutex
		var takeovers []bool
		createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			info, _ := idempotency.FromContext(r.Context())
			runs.Add(1)
			mu.Lock()
			takeovers = append(takeovers, info.Takeover)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"`+info.StableID+`"}`)
		})
		clk := clock.NewManual(epoch)
		s := fakeserver.NewServer(&fakeserver.Options{
			Clock:     clk,
			Endpoints: []fakeserver.Endpoint{{Pattern: "POST /orders", Handler: createOrder}},
		})
		t.Cleanup(s.Close)
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDelay, Path: "/orders", Delay: 2 * time.Second}))

		const key = "order-once-1"
		first := make(chan int, 1)
		go func() {
			st, _, _, _ := rtPost(s.Client(), s.URL+"/orders", key, `{"sku":"tea"}`)
			first <- st
		}()
		waitInProgress(t, s)
		clk.Advance(31 * time.Second) // past the 30s lease, inside the delay
		st, _, body, err := rtPost(s.Client(), s.URL+"/orders", key, `{"sku":"tea"}`)
		require.NoError(t, err)
		t.Logf("retry: %d %s", st, body)
		t.Logf("first: %d", <-first)

		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, int32(1), runs.Load(), "one key ran the app's handler %d times, takeover flags in order %v", runs.Load(), takeovers)
		require.Equal(t, 1, s.Stats().Executions)
	})
	t.Run("a delay fault never runs a payment twice", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		s := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
		t.Cleanup(s.Close)
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDelay, Path: "/payments", Delay: 2 * time.Second}))
		const key = "pay-once-1"
		first := make(chan string, 1)
		go func() {
			st, h, body, err := rtPost(s.Client(), s.URL+"/payments", key, payBody)
			first <- strings.Join([]string{http.StatusText(st), h.Get("Idempotent-Replayed"), body, errString(err)}, " | ")
		}()
		waitInProgress(t, s)
		clk.Advance(31 * time.Second)
		st, h, body, err := rtPost(s.Client(), s.URL+"/payments", key, payBody)
		require.NoError(t, err)
		t.Logf("retry: %d replayed=%q %s", st, h.Get("Idempotent-Replayed"), body)
		t.Logf("first: %s", <-first)
		require.Equal(t, 1, s.Stats().Executions, "one key, %+v", s.Stats())
	})
	// A status fault answers first; the drop waits for the retry.
	t.Run("a fault is never spent on a request another fault answered", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(nil)
		t.Cleanup(s.Close)
		const key = "drop-me-1"
		for _, f := range []string{`{"fault":"drop_response","key":"` + key + `"}`, `{"fault":"status","status":503}`} {
			resp, err := s.Client().Post(s.URL+"/_fake/faults", "application/json", strings.NewReader(f))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
		}
		st, _, _, err := rtPost(s.Client(), s.URL+"/payments", key, payBody)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, st)
		require.Equal(t, 0, s.Stats().Payments)

		// A fresh connection: Go's Transport resends a keyed request on a
		// reused connection that closed.
		_, _, _, err = rtPost(freshClient(t), s.URL+"/payments", key, payBody)
		require.Error(t, err, "the drop_response fault for %s never dropped an answer: it was spent on the 503 the status fault gave", key)
	})
	// Under RequireUUID an upper-case UUID is its lower-case form.
	t.Run("a key fault strikes the key in the form the server compares", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(&fakeserver.Options{RequireUUID: true})
		t.Cleanup(s.Close)
		const upper = "8E03978E-40D5-43E8-BC93-6894A57F9324"
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: strings.ToLower(upper)}))
		st, _, _, err := rtPost(s.Client(), s.URL+"/payments", upper, payBody)
		require.Error(t, err, "the drop_response fault for the key's canonical form let its upper-case spelling through (status %d)", st)
		lower := "1e03978e-40d5-43e8-bc93-6894a57f9324"
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: strings.ToUpper(lower)}))
		_, _, _, err = rtPost(freshClient(t), s.URL+"/payments", lower, payBody)
		require.Error(t, err, "the fault given in upper case let the lower-case key through")
	})
	// Acme's key and globex's same key are two intents.
	t.Run("a key fault strikes only its caller's key", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(nil)
		t.Cleanup(s.Close)
		const key = "shared-key-1"
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: key, Caller: "Bearer test_acme_2"}))
		post := func(auth string) error {
			r, _ := http.NewRequest(http.MethodPost, s.URL+"/payments", strings.NewReader(payBody))
			r.Header.Set("Idempotency-Key", key)
			r.Header.Set("Authorization", auth)
			tr := &http.Transport{} // a connection of its own: no silent retry on a reused one
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Do(r)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		globexErr := post("Bearer test_globex_1")
		acmeErr := post("Bearer test_acme_1")
		t.Logf("globex: %v; acme: %v", globexErr, acmeErr)
		require.NoError(t, globexErr, "acme's fault struck globex's intent")
		require.Error(t, acmeErr, "acme's fault missed acme's intent")
	})
	t.Run("a crash fault on PUT closes the connection", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(nil)
		t.Cleanup(s.Close)
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Path: "/orders/o1/status"}))
		r, _ := http.NewRequest(http.MethodPut, s.URL+"/orders/o1/status", strings.NewReader(`{"status":"SHIPPED"}`))
		r.Header.Set("Content-Type", "application/json")
		resp, err := s.Client().Do(r)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Logf("answer: %d %s", resp.StatusCode, body)
		}
		require.Error(t, err, "the crash fault on PUT answered instead of closing the connection")
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert, Path: "/orders/o1/status"}))
		_, err = trySend(freshClient(t), s.URL, req{Method: http.MethodPut, Path: "/orders/o1/status", NoKey: true,
			Body: `{"status":"DELIVERED"}`})
		require.Error(t, err, "crash_after_insert on PUT answered")
	})
}
