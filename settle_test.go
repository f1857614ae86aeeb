package idem_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// pastSendWindow moves the clock past the time an intent created now may be
// sent: the server may have forgotten its key.
const pastSendWindow = sendWindow + time.Minute

// oneAttempt is the context of a call that gives up after one attempt.
func oneAttempt() context.Context {
	return idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1})
}

// unknownOutcome leaves in pending: its one attempt meets fault.
func (e *env) unknownOutcome(t *testing.T, in *idem.Intent, kind fakeserver.FaultKind) {
	t.Helper()
	e.fault(t, fakeserver.Fault{Kind: kind, Key: in.Key()})
	_, err := e.client.Do(oneAttempt(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, persist.StatePending, in.State())
}

// TestSend keeps Client.Send, the one call for a tap: the action's intent,
// made or resumed, paid once.
func TestSend(t *testing.T) {
	t.Parallel()

	t.Run("it pays once, then returns the stored answer", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
		req := e.paymentRequest(t, 1500, "cus_1")

		first, err := e.client.Send(ctx, "checkout:send", req)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, first.StatusCode)
		assert.True(t, first.Replayed, "the lost answer was replayed to the retry")
		assert.Equal(t, 2, first.Attempts)

		again, err := e.client.Send(ctx, "checkout:send", req)
		require.NoError(t, err)
		assert.True(t, again.FromStore)
		assert.Equal(t, first.Body, again.Body)
		st := e.srv.Stats()
		assert.Equal(t, 2, st.Requests, "the second tap sent nothing")
		assert.Equal(t, 1, st.ProviderCharges)
	})

	t.Run("it resumes the unresolved intent of the same request", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		req := e.paymentRequest(t, 1500, "cus_1")
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
		_, err := e.client.Send(oneAttempt(), "checkout:resume", req)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		resp, err := e.newClient(t).Send(context.Background(), "checkout:resume", req)
		require.NoError(t, err)
		assert.True(t, resp.Replayed, "the same key, so the server's stored answer")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	t.Run("it refuses a changed request while the last is unresolved", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
		_, err := e.client.Send(oneAttempt(), "checkout:changed", e.paymentRequest(t, 1500, "cus_1"))
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		_, err = e.client.Send(context.Background(), "checkout:changed", e.paymentRequest(t, 1800, "cus_1"))
		var unresolved *idem.UnresolvedError
		require.ErrorAs(t, err, &unresolved)
		assert.Equal(t, 1, e.srv.Stats().Requests, "nothing was sent for the changed cart")
	})

	// An intent the lookup shows was never done cannot be paid by resending it,
	// and a new intent cannot pay twice: Send makes one and pays, whether the
	// intent was void already or the lookup finds it so during the Send.
	t.Run("it replaces a void intent with one it pays", func(t *testing.T) {
		t.Parallel()
		for _, settledFirst := range []bool{true, false} {
			ctx := context.Background()
			e := newEnv(t)
			req := e.paymentRequest(t, 1500, "cus_1")
			in, err := e.client.Intent(ctx, "checkout:void", req)
			require.NoError(t, err)
			e.unknownOutcome(t, in, fakeserver.FaultReset) // nothing reached the server
			e.clock.Advance(pastSendWindow)
			if settledFirst {
				resp, err := e.client.Settle(ctx, in)
				require.NoError(t, err)
				require.Nil(t, resp)
				require.Equal(t, persist.StateVoid, in.State())
			}

			resp, err := e.client.Send(ctx, "checkout:void", req)
			require.NoError(t, err, "settled first: %t", settledFirst)
			require.NotNil(t, resp, "settled first: %t", settledFirst)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.False(t, resp.FromStore)
			assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
			reloaded, err := e.client.Load(ctx, in.Key())
			require.NoError(t, err)
			assert.Equal(t, persist.StateVoid, reloaded.State(), "the void intent stays void")
		}
	})
}

func TestSettle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// prepare leaves the intent in the state to settle.
		prepare   func(t *testing.T, e *env, in *idem.Intent)
		noLookup  bool
		policy    idem.RetryPolicy // of the Settle call
		wantState persist.State
		wantErr   error // nil: no error
		wantCode  int   // 0: no Response
		// wantPosts and wantGets count what Settle sends: resends and
		// lookups.
		wantPosts, wantGets int
	}{
		{
			name: "resolved: the stored answer, nothing sent",
			prepare: func(t *testing.T, e *env, in *idem.Intent) {
				_, err := e.client.Do(context.Background(), in)
				require.NoError(t, err)
			},
			wantState: persist.StateSucceeded, wantCode: http.StatusCreated,
		},
		{
			name: "pending, key kept: resent with its key",
			prepare: func(t *testing.T, e *env, in *idem.Intent) {
				e.unknownOutcome(t, in, fakeserver.FaultDropResponse)
			},
			wantState: persist.StateSucceeded, wantCode: http.StatusCreated, wantPosts: 1,
		},
		{
			name: "past the send window, done: found by the lookup",
			prepare: func(t *testing.T, e *env, in *idem.Intent) {
				e.unknownOutcome(t, in, fakeserver.FaultDropResponse)
				e.clock.Advance(pastSendWindow)
			},
			wantState: persist.StateSucceeded, wantCode: http.StatusOK, wantGets: 1,
		},
		{
			name: "past the send window, never done: void",
			prepare: func(t *testing.T, e *env, in *idem.Intent) {
				e.unknownOutcome(t, in, fakeserver.FaultReset)
				e.clock.Advance(pastSendWindow)
			},
			wantState: persist.StateVoid, wantGets: 1,
		},
		{
			name: "past the send window, no lookup: undecided",
			prepare: func(t *testing.T, e *env, in *idem.Intent) {
				e.unknownOutcome(t, in, fakeserver.FaultDropResponse)
				e.clock.Advance(pastSendWindow)
			},
			noLookup:  true,
			wantState: persist.StateExpired, wantErr: idem.ErrOutcomeUnknown,
		},
		{
			name: "past the send window, the server holds the key in progress: undecided",
			prepare: func(t *testing.T, e *env, in *idem.Intent) {
				e.unknownOutcome(t, in, fakeserver.FaultCrashAfterInsert)
				e.clock.Advance(pastSendWindow)
			},
			wantState: persist.StateExpired, wantErr: idem.ErrOutcomeUnknown, wantCode: http.StatusConflict, wantGets: 1,
		},
		{
			name: "pending, the budget runs out: undecided, still pending",
			prepare: func(t *testing.T, e *env, in *idem.Intent) {
				e.unknownOutcome(t, in, fakeserver.FaultDropResponse)
				e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, Count: 100})
			},
			policy:    idem.RetryPolicy{MaxAttempts: 3},
			wantState: persist.StatePending, wantErr: idem.ErrOutcomeUnknown, wantPosts: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			// The settling Client counts what it sends. It is made first,
			// as the app's own Client would be: one made after the attempt
			// could not tell when an earlier process last sent it, and
			// would not trust a 404 until the reconcile delay had passed.
			sent := &methodCounter{base: e.srv.Client().Transport}
			opts := []idem.Option{idem.WithHTTPClient(&http.Client{Transport: sent})}
			if tc.noLookup {
				opts = append(opts, idem.WithLookup(nil))
			}
			c := e.newClient(t, opts...)
			in := e.newIntent(t, "checkout:settle", 1500)
			tc.prepare(t, e, in)

			resp, err := c.Settle(idem.ContextWithRetryPolicy(context.Background(), tc.policy), in)
			if tc.wantErr == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.wantErr)
			}
			if tc.noLookup {
				assert.ErrorContains(t, err, "Server.Lookup", "the error says what would decide it")
			}
			if tc.wantCode == 0 {
				assert.Nil(t, resp)
			} else {
				require.NotNil(t, resp)
				assert.Equal(t, tc.wantCode, resp.StatusCode)
			}
			assert.Equal(t, tc.wantState, in.State())
			assert.Equal(t, tc.wantPosts, sent.count(http.MethodPost), "resends")
			assert.Equal(t, tc.wantGets, sent.count(http.MethodGet), "lookups")
			assert.LessOrEqual(t, e.srv.Stats().ProviderCharges, 1)
		})
	}
}

// methodCounter counts the requests sent through it by method.
type methodCounter struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    map[string]int
}

func (m *methodCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	m.mu.Lock()
	if m.n == nil {
		m.n = make(map[string]int)
	}
	m.n[req.Method]++
	m.mu.Unlock()
	return m.base.RoundTrip(req)
}

func (m *methodCounter) count(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n[method]
}

// countingTransport counts the requests in flight through it, and keeps
// the highest count seen.
type countingTransport struct {
	base          http.RoundTripper
	inFlight, max atomic.Int32
	gate          chan struct{} // each request waits here, if not nil
	arrived       chan struct{} // told of each request before it waits, if not nil
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			break
		}
	}
	if c.arrived != nil {
		c.arrived <- struct{}{}
	}
	if c.gate != nil {
		<-c.gate
	}
	return c.base.RoundTrip(req)
}

// cancelOnRequest cancels a context on every request and fails it, as a
// request does that is cut short by its context.
type cancelOnRequest struct{ cancel context.CancelFunc }

func (c cancelOnRequest) RoundTrip(req *http.Request) (*http.Response, error) {
	c.cancel()
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// One Client, two budgets: the context's policy replaces the fields it sets
// and keeps the Client's others.
func TestContextWithRetryPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{InitialInterval: time.Second, Jitter: -1}))
	short := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 3})
	in := e.newIntent(t, "checkout:budget", 100)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, Count: 5})

	_, err := e.client.Do(short, in)
	var retryErr *idem.RetryError
	require.ErrorAs(t, err, &retryErr)
	assert.Equal(t, idem.StopAttempts, retryErr.Reason)
	assert.Equal(t, 3, retryErr.Attempts, "the foreground budget")
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second}, e.clock.Sleeps(), "the Client's backoff, without jitter")

	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err, "the Client's own budget of 10 attempts outlasts the fault")
	assert.Equal(t, 3, resp.Attempts)

	// A policy out of range given for a call fails each call made with it at
	// once, naming the field, before the intent is armed or anything sent: it
	// never runs under defaults the app did not ask for.
	t.Run("a policy out of range fails each call made with it", func(t *testing.T) {
		t.Parallel()
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
			w.WriteHeader(http.StatusCreated)
		}))
		defer srv.Close()
		store := persist.NewMemory(nil)
		c, err := idem.NewWith(idem.WithStore(store), idem.WithClock(clock.NewManual(epoch)),
			idem.WithLookup(idem.LookupQuery("idempotency_key")))
		require.NoError(t, err)
		req := idem.Request{Method: http.MethodPost, URL: srv.URL + "/payments", Body: []byte(`{}`)}

		bad := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{Jitter: 5, MaxAttempts: -1})
		want := func(t *testing.T, err error) {
			t.Helper()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "ContextWithRetryPolicy: RetryPolicy.Jitter is 5")
			assert.Contains(t, err.Error(), "MaxAttempts is -1")
		}
		_, err = c.Send(bad, "checkout:bad-policy", req)
		want(t, err)
		in, err := c.Intent(context.Background(), "checkout:bad-policy", req)
		require.NoError(t, err)
		_, err = c.Do(bad, in)
		want(t, err)
		_, err = c.Settle(bad, in)
		want(t, err)
		_, err = c.SettleAll(bad)
		want(t, err)
		_, err = c.Reconcile(bad, in)
		want(t, err)
		hr, err := http.NewRequestWithContext(bad, http.MethodPost, srv.URL+"/payments", nil)
		require.NoError(t, err)
		_, err = (&http.Client{Transport: c.RoundTripper(nil)}).Do(hr)
		want(t, err)

		assert.Zero(t, requests.Load(), "nothing was sent")
		recs, err := store.List(context.Background(), persist.Filter{})
		require.NoError(t, err)
		assert.Empty(t, recs, "nothing was armed")

		// The same call under a policy in range goes through.
		good := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 2, Jitter: -1})
		resp, err := c.Do(good, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
	})
}

// switchable is an http.Client whose connections are refused while down
// is set: the dial fails before any request is written, as when the
// network is off, and the trace proves it.
func switchable() (*http.Client, *atomic.Bool) {
	var down atomic.Bool
	tr := http.DefaultTransport.(*http.Transport).Clone()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			return nil, errors.New("connect: network is unreachable")
		}
		return dial(ctx, network, addr)
	}
	return &http.Client{Transport: tr}, &down
}

func TestSettleAll(t *testing.T) {
	t.Parallel()
	t.Run("a not-sent intent is never sent by a SettleAll that listed it earlier", func(t *testing.T) {
		settleAllRacingANotSentTap(t, false)
	})
	t.Run("a not-sent intent is never sent by another Client's SettleAll that listed it earlier", func(t *testing.T) {
		settleAllRacingANotSentTap(t, true)
	})

	t.Run("the README's loop of Settle over Unresolved never sends a not-sent intent", settleLoopOverUnresolved)

	t.Run("one at a time, it settles in the caller's goroutine", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		// goroutine returns the number of the goroutine that calls it.
		goroutine := func() string {
			buf := make([]byte, 64)
			f := strings.Fields(string(buf[:runtime.Stack(buf, false)]))
			return f[1]
		}
		var (
			mu    sync.Mutex
			where []string
		)
		c := e.newClient(t, idem.WithSettleConcurrency(1), func(cfg *idem.Config) {
			cfg.SettleProgress = func(idem.Settled, int, int) {
				mu.Lock()
				where = append(where, goroutine())
				mu.Unlock()
			}
		})
		for _, name := range []string{"a", "b"} {
			in, err := c.Intent(ctx, name, e.paymentRequest(t, 100, "cus_1"))
			require.NoError(t, err)
			require.NoError(t, idem.Arm(c, ctx, in))
		}
		out, err := c.SettleAll(ctx)
		require.NoError(t, err)
		require.Len(t, out, 2)
		assert.Equal(t, []string{goroutine(), goroutine()}, where)
	})

	t.Run("it reports each intent and bounds its concurrency", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		const n = 9
		var ins []*idem.Intent
		for i := range n {
			in := e.newIntent(t, "checkout:all-"+string(rune('a'+i)), 100+i)
			e.unknownOutcome(t, in, fakeserver.FaultDropResponse)
			ins = append(ins, in)
			e.clock.Advance(time.Second)
		}
		declined, err := e.client.NewIntent(ctx, "checkout:declined", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(e.client, ctx, declined)) // tapped, and the app died before its first byte
		paid := e.newIntent(t, "checkout:paid", 100)
		_, err = e.client.Do(ctx, paid)
		require.NoError(t, err)

		tr := &countingTransport{base: e.srv.Client().Transport, gate: make(chan struct{}), arrived: make(chan struct{})}
		restarted := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: tr}))
		go func() {
			// Each settle sends one request. Every batch is held until all
			// four of its requests are in flight: the settles overlap however
			// the goroutines are scheduled (released as they came, the
			// requests of a loaded machine could each end before the next
			// began).
			for left := n + 1; left > 0; {
				batch := min(4, left)
				for range batch {
					<-tr.arrived
				}
				for range batch {
					tr.gate <- struct{}{}
				}
				left -= batch
			}
		}()
		settled, err := restarted.SettleAll(ctx)
		require.NoError(t, err)
		require.Len(t, settled, n+1, "every unresolved intent, and only those")
		for i, s := range settled[:n] {
			require.NoError(t, s.Err)
			assert.Equal(t, ins[i].Key(), s.Intent.Key(), "oldest first")
			assert.Equal(t, persist.StateSucceeded, s.Intent.State())
			assert.True(t, s.Response.Replayed)
		}
		last := settled[n]
		assert.Equal(t, declined.Key(), last.Intent.Key())
		var apiErr *idem.APIError
		require.ErrorAs(t, last.Err, &apiErr)
		assert.Equal(t, http.StatusPaymentRequired, apiErr.StatusCode)
		assert.Equal(t, persist.StateFailed, last.Intent.State())
		assert.LessOrEqual(t, tr.max.Load(), int32(4), "at most four settles at once")
		assert.Equal(t, int32(4), tr.max.Load(), "settles overlap")
		assert.Equal(t, n+1, e.srv.Stats().ProviderCharges, "each paid intent charged once")
	})

	t.Run("it starts no settle once the context ends", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		const n = 12
		for i := range n {
			e.unknownOutcome(t, e.newIntent(t, "checkout:cancel-"+string(rune('a'+i)), 100), fakeserver.FaultDropResponse)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The app goes to the background as the first resend goes out.
		sent := &methodCounter{base: cancelOnRequest{cancel}}
		c := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: sent}))

		settled, err := c.SettleAll(ctx)
		require.NoError(t, err)
		require.Len(t, settled, n)
		for _, s := range settled {
			assert.ErrorIs(t, s.Err, context.Canceled)
			assert.Equal(t, persist.StatePending, s.Intent.State())
		}
		assert.LessOrEqual(t, sent.count(http.MethodPost), 4, "no more than the settles under way when it ended")
	})

	// The Pay screen made an intent that the user never tapped: after a
	// restart, with another payment in flight when the app died, only the
	// tapped one is unresolved, and SettleAll charges it alone.
	t.Run("it never sends an intent nobody tapped", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		shown, err := e.client.Intent(ctx, "checkout:cart-shown", e.paymentRequest(t, 700, "cus_1"))
		require.NoError(t, err)
		assert.Equal(t, persist.StateNew, shown.State())
		// The user leaves the Pay screen; another payment is tapped, and its
		// answer is lost as the app dies.
		tapped, err := e.client.Intent(ctx, "checkout:cart-tapped", e.paymentRequest(t, 300, "cus_1"))
		require.NoError(t, err)
		e.unknownOutcome(t, tapped, fakeserver.FaultDropResponse)

		restarted := e.newClient(t)
		unresolved, err := restarted.Unresolved(ctx)
		require.NoError(t, err)
		require.Len(t, unresolved, 1, "only the intent whose sending began")
		assert.Equal(t, tapped.Key(), unresolved[0].Key())
		settled, err := restarted.SettleAll(ctx)
		require.NoError(t, err)
		require.Len(t, settled, 1)
		require.NoError(t, settled[0].Err)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "the untapped cart is never charged")
		assert.Equal(t, 1, e.srv.Stats().Payments, "the untapped cart's key never reached the server")

		// Showing the Pay screen again after the restart makes a new key: the
		// old one was never used.
		again, err := restarted.Intent(ctx, "checkout:cart-shown", e.paymentRequest(t, 700, "cus_1"))
		require.NoError(t, err)
		assert.NotEqual(t, shown.Key(), again.Key())
	})
}

func TestHTTPRequest(t *testing.T) {
	t.Parallel()
	t.Run("a request in the app's hands is never replaced by a changed cart nor voided by a lookup miss", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		req, err := e.client.HTTPRequest(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, persist.StatePending, in.State(), "handed out, it may be sent")

		// The app's send is in transit; the user changes the cart.
		_, err = e.client.Intent(ctx, "checkout", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorAs(t, err, new(*idem.UnresolvedError), "a changed cart never replaces it")
		// A restart, long past the reconcile delay: the lookup finds
		// nothing yet, and that is not trusted.
		e.clock.Advance(time.Hour)
		next := e.newClient(t)
		e.clock.Advance(3 * time.Minute) // past the delay from its birth too
		stored, err := next.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = next.Reconcile(ctx, stored)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "its request may still arrive")
		assert.NotEqual(t, persist.StateVoid, stored.State())

		// The request lands: one charge, and the intent settles on it.
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.NoError(t, next.SendEnded(ctx, stored))
		_, err = next.Settle(ctx, stored)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, stored.State())
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	t.Run("an intent too old to send is never handed out, paid or not", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		paid, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, paid)
		require.NoError(t, err)
		open, err := e.client.Intent(ctx, "tip", e.paymentRequest(t, 5, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.HTTPRequest(ctx, open)
		require.NoError(t, err) // handed out, never sent

		// A day later the server has forgotten both keys: either request
		// would be charged anew.
		e.clock.Advance(24 * time.Hour)
		req, err := e.client.HTTPRequest(ctx, paid)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.Equal(t, persist.StateSucceeded, paid.State())
		req, err = e.client.HTTPRequest(ctx, open)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Nil(t, req)
		assert.Equal(t, persist.StateExpired, open.State(), "it is settled through the lookup")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	// Path: one attempt, answered 503 by a proxy in front of the server:
	// the outcome is unknown, and the server has no record of the key. The
	// lookup's miss voids the intent, and the app pays anew. Handed out,
	// the void intent's request would be sent by the app's own
	// http.Client: the server, with no record of the key, charges again,
	// and the device still says void, since HTTPRequest's answers are not
	// recorded and a resolved intent is never reconciled again.
	t.Run("a void intent is never handed out", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		pay := e.paymentRequest(t, 1500, "cus_1")
		in, err := e.client.Intent(ctx, "checkout:cart-4", pay)
		require.NoError(t, err)
		require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 503, Path: "/payments"}))
		_, err = e.client.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		e.clock.Advance(10 * time.Minute) // past the reconcile delay
		_, err = e.client.Reconcile(ctx, in)
		require.NoError(t, err)
		require.Equal(t, persist.StateVoid, in.State())
		// Told void, the app pays anew.
		again, err := e.client.NewIntent(ctx, "checkout:cart-4", pay)
		require.NoError(t, err)
		_, err = e.client.Do(ctx, again)
		require.NoError(t, err)

		req, err := e.client.HTTPRequest(ctx, in)
		require.Error(t, err, "the void intent's request would charge again")
		assert.Nil(t, req)
		assert.Contains(t, err.Error(), "create a new intent", "the error says what to do")
		assert.Equal(t, persist.StateVoid, in.State(), "nothing changes")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	t.Run("a failed intent is never handed out: the server may not have kept its refusal", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 1500, "cus_declined"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, in)
		require.Error(t, err)
		require.Equal(t, persist.StateFailed, in.State())
		req, err := e.client.HTTPRequest(ctx, in)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.Equal(t, persist.StateFailed, in.State())
	})
	t.Run("a paid intent is handed out: the server replays its answer", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, in)
		require.NoError(t, err)
		req, err := e.client.HTTPRequest(ctx, in)
		require.NoError(t, err)
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	// Path: a tap ends not sent (offline), and the app asks for its
	// request a day later through HTTPRequest, to send it from its own
	// queue when the network is back. Handed out with its day-old
	// CreatedAt and clocks, the hand-out's protection ("reconciled as if
	// its request were still in transit, up to the server's retention")
	// would have run out already: a Reconcile a few minutes later would
	// take the lookup's miss and void the intent while the app still holds
	// the request; the app pays anew, then its queue sends the held
	// request: two charges, and the device says void.
	t.Run("a not-sent intent handed out a day later is never voided while held", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		clk := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
		t.Cleanup(srv.Close)
		var offline atomic.Bool
		dialer := &net.Dialer{}
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if offline.Load() {
				return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("network is unreachable")}
			}
			return dialer.DialContext(ctx, network, addr)
		}}}
		store := persist.NewMemory(nil)
		c, err := idem.New(idem.Config{Store: store, HTTPClient: hc, Clock: clk,
			Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.NewIntent(ctx, "checkout:cart-8", req)
		require.NoError(t, err)
		offline.Store(true)
		_, err = c.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
		require.ErrorIs(t, err, idem.ErrNotSent)
		offline.Store(false)

		clk.Advance(25 * time.Hour)
		held, err := c.HTTPRequest(ctx, in)
		require.NoError(t, err, "never sent, it may be sent now")
		clk.Advance(5 * time.Minute)
		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "its request is in the app's hands")
		assert.Equal(t, persist.StatePending, in.State())

		// A later Client (the next start) protects it too.
		next, err := idem.New(idem.Config{Store: store, HTTPClient: hc, Clock: clk,
			Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
		require.NoError(t, err)
		clk.Advance(5 * time.Minute)
		stored, err := next.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = next.Reconcile(ctx, stored)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "its request is in the app's hands")

		resp, err := hc.Do(held)
		require.NoError(t, err)
		resp.Body.Close()
		require.NoError(t, next.SendEnded(ctx, stored))
		_, err = next.Settle(ctx, stored)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, stored.State())
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})
	// Path: HTTPRequest arms the intent (durable), then its hand-out
	// write fails: it returns no request. An error that matched neither
	// ErrNotSent nor ErrOutcomeUnknown would let the app, which never got
	// a request to send, tell the user the payment did not go out; but
	// the intent stays armed in the store, and the next start's SettleAll
	// sends and charges it.
	t.Run("a hand-out whose write fails says the outcome is unknown", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		cfg := idem.Config{Store: failHandOut{e.store}, Clock: e.clock, HTTPClient: e.srv.Client(),
			Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}}
		c, err := idem.New(cfg)
		require.NoError(t, err)
		in, err := c.NewIntent(ctx, "checkout:cart-15", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)
		req, err := c.HTTPRequest(ctx, in)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the armed intent may be sent later")
		assert.NotErrorIs(t, err, idem.ErrNotSent)

		next, err := idem.New(cfg)
		require.NoError(t, err)
		next.SettleAll(ctx)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "a later SettleAll sends it, as the error said")
	})
	t.Run("a hand-out whose read after the arming fails says the outcome is unknown", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		store := &failGet{Store: e.store}
		c, err := idem.New(idem.Config{Store: store, Clock: e.clock, HTTPClient: e.srv.Client(),
			Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
		require.NoError(t, err)
		in, err := c.NewIntent(ctx, "checkout", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)
		store.failing.Store(true)
		req, err := c.HTTPRequest(ctx, in)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the armed intent may be sent later")
		assert.NotErrorIs(t, err, idem.ErrNotSent)
	})
	t.Run("a lookup miss is trusted once the app's send ended and the reconcile delay passed", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.HTTPRequest(ctx, in)
		require.NoError(t, err)
		require.NoError(t, e.client.SendEnded(ctx, in)) // the app never sent it after all
		e.clock.Advance(3 * time.Minute)
		_, err = e.client.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateVoid, in.State())
	})

	// Path (the simulation's seed 7805563): a proxy's 407 left an intent
	// unknown; its request, handed out moments before it grew too old to
	// send, waited in the app's outbox. The intent then expired, and the
	// lookup's miss was trusted, since the intent was older than the
	// server's retention: the app's request then charged an intent that
	// read void.
	t.Run("a request handed out just before the intent grew too old is waited for from the hand-out", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		var refused atomic.Bool
		proxy := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPost && refused.CompareAndSwap(false, true) {
				// The proxy's own answer: the server never sees the request.
				return &http.Response{StatusCode: http.StatusProxyAuthRequired, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			}
			return e.srv.Client().Transport.RoundTrip(r)
		})
		c := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: proxy}), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		e.clock.Advance(sendWindow - 30*time.Second)
		req, err := c.HTTPRequest(ctx, in) // the app keeps it in its outbox
		require.NoError(t, err)
		e.clock.Advance(2 * time.Hour) // the intent is too old to send, and older than the retention
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the app's request may still be sent")
		assert.NotEqual(t, persist.StateVoid, in.State())

		resp, err := e.srv.Client().Do(req) // the app sends it
		require.NoError(t, err)
		resp.Body.Close()
		_, err = c.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// Path (found by a red-team pass): the app sends a handed-out request
	// an hour later, its client gives up while a proxy holds the request,
	// and the app calls SendEnded. Only the Client it called knew when the
	// send ended: another Client on the store counted the reconcile delay
	// from the arming, an hour past, and voided the intent before the
	// held request charged it.
	t.Run("its end, reported with SendEnded, covers another Client's lookup", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		b := e.newClient(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		req, err := e.client.HTTPRequest(ctx, in)
		require.NoError(t, err)
		e.clock.Advance(time.Hour) // the app sends it an hour later
		held := &heldNetwork{base: e.srv.Client().Transport}
		held.holdNext(1) // a proxy holds it, and the app's client gives up
		_, err = (&http.Client{Transport: held}).Do(req)
		require.Error(t, err)
		require.NoError(t, e.client.SendEnded(ctx, in))

		e.clock.Advance(time.Minute)
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the app's request, sent a minute ago, may still be on its way")
		held.deliver(t)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
		assert.NotEqual(t, persist.StateVoid, loaded.State())
	})

	t.Run("its end, reported with SendEnded, never ends the claim of a Client that took the intent over", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
		t.Cleanup(srv.Close)
		store := persist.NewMemory(nil)
		server := idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key", ReconcileDelay: reconcileDelay}
		a, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Clock: truth, Server: server})
		require.NoError(t, err)
		bClock := &gatedClock{m: truth, sleeping: make(chan time.Duration), release: make(chan struct{})}
		b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Clock: bClock, Server: server,
			RetryPolicy: idem.RetryPolicy{MaxElapsed: 30 * time.Minute, MaxRetryAfter: 5 * time.Minute, Jitter: -1}})
		require.NoError(t, err)
		c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Clock: truth, Server: server})
		require.NoError(t, err)

		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		_, err = a.HTTPRequest(ctx, in) // the app holds the request, and never sends it
		require.NoError(t, err)
		// b takes the intent over and sends it; a gateway asks it to wait.
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: 503, RetryAfter: "150", Count: 1}))
		twin, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		bDone := make(chan error, 1)
		go func() {
			_, err := b.Do(ctx, twin)
			bDone <- err
		}()
		wait := <-bClock.sleeping
		require.NoError(t, a.SendEnded(ctx, in)) // the app's own send ended: it never sent it

		truth.Advance(wait + time.Second)
		seen, err := c.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = c.Reconcile(ctx, seen)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "b's call may still send under its claim")
		bClock.release <- struct{}{} // b retries: the server charges
		require.NoError(t, <-bDone)
		assert.Equal(t, 1, srv.Stats().Payments)
		assert.NotEqual(t, persist.StateVoid, seen.State(), "the intent reads void while its payment was made")
	})

	t.Run("its end, reported with SendEnded, lets another Client trust a miss once the reconcile delay passed", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		b := e.newClient(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.HTTPRequest(ctx, in)
		require.NoError(t, err)
		e.clock.Advance(time.Hour)
		require.NoError(t, e.client.SendEnded(ctx, in)) // the app never sent it after all
		e.clock.Advance(reconcileDelay + time.Second)
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.NoError(t, err, "not a wait for the server's retention")
		assert.Equal(t, persist.StateVoid, loaded.State())
	})

	t.Run("it is the intent's request", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		for _, quoted := range []bool{false, true} {
			var opts []idem.Option
			wantKey := func(k string) string { return k }
			if quoted {
				opts = append(opts, idem.WithQuotedKey())
				wantKey = func(k string) string { return `"` + k + `"` }
			}
			c := e.newClient(t, opts...)
			in, err := c.NewIntent(ctx, "", e.paymentRequest(t, 100, "cus_1"))
			require.NoError(t, err)
			want := in.Request()

			req, err := c.HTTPRequest(ctx, in)
			require.NoError(t, err)
			assert.Equal(t, want.Method, req.Method)
			assert.Equal(t, want.URL, req.URL.String())
			assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
			assert.Equal(t, wantKey(in.Key()), req.Header.Get("Idempotency-Key"))
			assert.Equal(t, int64(len(want.Body)), req.ContentLength)
			for range 2 { // GetBody gives the same bytes every time
				body, err := req.GetBody()
				require.NoError(t, err)
				var b [4096]byte
				n, _ := body.Read(b[:])
				assert.Equal(t, want.Body, b[:n])
			}
			resp, err := e.srv.Client().Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			// The answer went past the Client: the intent, handed out, may
			// have been sent, and a Do is answered from the server's record
			// of the key.
			assert.Equal(t, persist.StatePending, in.State())
			got, err := c.Do(ctx, in)
			require.NoError(t, err)
			assert.True(t, got.Replayed)
		}
		assert.Equal(t, 2, e.srv.Stats().ProviderCharges)
	})
}

// failHandOut is a real store that cannot write the hand-out (the disk
// filled up between the arming write and the next).
type failHandOut struct{ persist.Store }

func (s failHandOut) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec.HandedOut {
		return errors.New("write: no space left on device")
	}
	return s.Store.Write(ctx, rec, old)
}

// failGet is a real store whose reads fail once failing is set.
type failGet struct {
	persist.Store
	failing atomic.Bool
}

func (s *failGet) Get(ctx context.Context, key string) (*persist.Record, error) {
	if s.failing.Load() {
		return nil, errors.New("read: input/output error")
	}
	return s.Store.Get(ctx, key)
}

// settleLoopOverUnresolved holds a path a red-team pass found, which had
// charged twice or told the app a false outcome.
//
// Path: a payment's call ends not sent (the server's port refused the
// connection) and the app tells its user so. At the next start the app
// settles as README.md says ("client.Settle(ctx, in) for an intent from
// client.Unresolved(ctx)"): Unresolved, documented as "the intents whose
// outcome is not known yet", lists the not-sent intent (its outcome is
// known: not sent), and Settle sends it, though SettleAll would not. The
// user, told it was not paid, is charged.
func settleLoopOverUnresolved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := fakeserver.NewServer(nil)
	t.Cleanup(srv.Close)
	// A port nobody listens on: the connection is refused.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	// The app's server is reached through the dead port at first (no
	// network), then through the right one.
	var route atomic.Value
	route.Store(deadURL)
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		u := route.Load().(string)
		r.URL.Host = u[len("http://"):]
		r.Host = ""
		return srv.Client().Transport.RoundTrip(r)
	})}
	dir := filepath.Join(t.TempDir(), "idem")
	fs, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	server := idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}
	c, err := idem.New(idem.Config{Store: fs, HTTPClient: hc, Server: server,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 2, InitialInterval: time.Millisecond}})
	require.NoError(t, err)
	_, err = c.Send(ctx, "checkout", payment1500(t, srv))
	require.ErrorIs(t, err, idem.ErrNotSent, "the app tells its user: not paid")
	require.NoError(t, fs.Close())

	// The next start, with the network back.
	route.Store(srv.URL)
	fs, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	t.Cleanup(func() { fs.Close() })
	c, err = idem.New(idem.Config{Store: fs, HTTPClient: hc, Server: server})
	require.NoError(t, err)
	pending, err := c.Unresolved(ctx)
	require.NoError(t, err)
	for _, in := range pending {
		_, _ = c.Settle(ctx, in) // README: "client.Settle(ctx, in) for an intent from client.Unresolved(ctx)"
	}
	assert.Empty(t, pending, "Unresolved lists an intent whose outcome is known: not sent")
	assert.Equal(t, 0, srv.Stats().Payments, "the user was told the payment was not sent")
}

// settleAllRacingANotSentTap: SettleAll, one intent at a time, lists two
// intents; while it works on the first, the user's tap of the second ends
// "not sent" (the server is briefly unreachable), on SettleAll's own
// Client or, with another, on a second Client of the store. SettleAll
// then reaches the second intent, and must not send it.
func settleAllRacingANotSentTap(t *testing.T, another bool) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	// The first intent's settle holds SettleAll's one worker until
	// released, at a server that then answers 503.
	entered, release := make(chan struct{}, 1), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(slow.Close)
	hc, down := switchable()
	settler := e.newClient(t, idem.WithHTTPClient(hc), idem.WithSettleConcurrency(1))
	app := settler
	if another {
		settler = e.newClient(t, idem.WithSettleConcurrency(1))
		app = e.newClient(t, idem.WithHTTPClient(hc))
	}

	first, err := settler.Intent(ctx, "other", idem.Request{Method: http.MethodPost, URL: slow.URL + "/payments", Body: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, idem.Arm(settler, ctx, first))
	e.clock.Advance(time.Second)
	tap, err := app.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
	require.NoError(t, err)
	require.NoError(t, idem.Arm(app, ctx, tap)) // the tap is dialing

	settled := make(chan []idem.Settled, 1)
	go func() {
		out, _ := settler.SettleAll(oneAttempt())
		settled <- out
	}()
	<-entered // SettleAll listed both and works on the first

	down.Store(true) // the server is briefly unreachable
	_, err = app.Do(ctx, tap)
	require.ErrorIs(t, err, idem.ErrNotSent, "the user is told it was not sent")
	down.Store(false)

	close(release)
	out := <-settled
	require.Len(t, out, 2)
	assert.Equal(t, tap.Key(), out[1].Intent.Key())
	assert.ErrorIs(t, out[1].Err, idem.ErrNotSent)
	assert.Zero(t, e.srv.Stats().ProviderCharges, "what the user was told was not sent is never charged")
	stored, err := app.Load(ctx, tap.Key())
	require.NoError(t, err)
	assert.Equal(t, persist.StateNotSent, stored.State())
}
