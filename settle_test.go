package idem_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
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
	"github.com/idemkit/idem/persist/persisttest"
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

	// A second file of a paid intent's key, whose name sorts first (a
	// copy under the action's earlier name, from a backup), must not
	// hide the paid intent. Neither file is trusted, so no new intent.
	t.Run("a second file of the paid key stops the action, never pays again", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)
		dir := filepath.Join(t.TempDir(), "idem")
		const action = "checkout:cart-42"

		send := func() (*idem.Response, error) {
			store, err := persist.OpenDir(dir, nil)
			require.NoError(t, err)
			defer func() { require.NoError(t, store.Close()) }()
			c, err := idem.New(idem.Config{Store: store, Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
				map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			return c.Send(ctx, action, req)
		}
		resp, err := send()
		require.NoError(t, err)
		require.Equal(t, 201, resp.StatusCode)
		require.Equal(t, 1, srv.Stats().ProviderCharges)

		// The key of the paid intent, and its file.
		store, err := persist.OpenDir(dir, nil)
		require.NoError(t, err)
		recs, err := store.List(ctx, persist.Filter{Name: action})
		require.NoError(t, err)
		require.Len(t, recs, 1)
		paid := recs[0]
		require.NoError(t, store.Close())
		own, _ := recordFile(t, dir, paid.Key)

		// The same intent under an earlier name of the action, whose file
		// sorts before the action's own.
		for i := 0; ; i++ {
			require.Less(t, i, 500)
			older := paid.Clone()
			older.Name = "cart:42:v" + strconv.Itoa(i)
			older.Rev = ""
			odir := filepath.Join(t.TempDir(), "older")
			ostore, err := persist.OpenDir(odir, nil)
			require.NoError(t, err)
			require.NoError(t, persisttest.Put(ctx, ostore, older))
			require.NoError(t, ostore.Close())
			name, data := recordFile(t, odir, paid.Key)
			if name < own {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
				break
			}
		}

		resp, err = send()
		charges := srv.Stats().ProviderCharges
		if charges != 1 {
			t.Fatalf("the paid action was charged %d times: the second Send (err %v, status %v) found no intent for %q, for its file %s became a stray second file of the key, and paid again with a new key", charges, err, statusOf(resp), action, own)
		}
		// Neither file is trusted: the Send is refused as damage.
		var ce *persist.CorruptError
		require.ErrorAs(t, err, &ce)
		require.Nil(t, resp)

		// Quarantine of the copy leaves the action's own file its record.
		store, err = persist.OpenDir(dir, nil)
		require.NoError(t, err)
		_, err = store.List(ctx, persist.Filter{})
		var copyPath string
		for _, c := range persist.CorruptErrors(err) {
			if filepath.Base(c.Path) != own {
				copyPath = c.Path
			}
		}
		require.NotEmpty(t, copyPath, "both files are reported")
		_, err = store.Quarantine(ctx, copyPath)
		require.NoError(t, err)
		require.NoError(t, store.Close())
		resp, err = send()
		require.NoError(t, err)
		require.True(t, resp.FromStore, "the stored answer, nothing sent")
		require.Equal(t, 1, srv.Stats().ProviderCharges)
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
	t.Run("it finds every unresolved intent after an index copied from another store", settleAllAfterIndexCopiedFromAnotherStore)

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

func statusOf(r *idem.Response) any {
	if r == nil {
		return nil
	}
	return r.StatusCode
}

// recordFile returns the name of the file in dir holding key, and its
// content.
func recordFile(t *testing.T, dir, key string) (string, []byte) {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, de := range des {
		if filepath.Ext(de.Name()) != ".json" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, de.Name()))
		require.NoError(t, err)
		if bytes.Contains(data, []byte(`"key":"`+key+`"`)) {
			return de.Name(), data
		}
	}
	t.Fatalf("no file of key %q in %s", key, dir)
	return "", nil
}

// rtPay makes n payments of action names prefix+i in the store in dir,
// then closes it. With lost set, the first one's answer (on a fresh connection, which
// net/http's transport does not retry by itself) is lost and the
// call gives up after one attempt: its outcome is unknown.
func rtPay(t *testing.T, srv *fakeserver.Server, dir, prefix string, n int, lost bool) {
	t.Helper()
	ctx := context.Background()
	store, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	// No lookup in this run, so a lost answer stays unknown.
	c, err := idem.New(idem.Config{Store: store,
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		Server:     idem.Server{Mark: idem.MarkEcho}})
	require.NoError(t, err)
	for i := range n {
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
			map[string]any{"amount": 100 + i, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		callCtx := ctx
		if lost && i == 0 {
			require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
			callCtx = idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1})
		}
		_, err = c.Send(callCtx, prefix+string(rune('a'+i)), req)
		if lost && i == 0 {
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		} else {
			require.NoError(t, err)
		}
	}
	require.NoError(t, store.Close())
}

// settleAllAfterIndexCopiedFromAnotherStore keeps "never lose an intent"
// and the persist docs' "The store does not use an index ... copied from
// another store".
//
// The path to the failure it guards: device store B holds two paid intents and one
// whose answer was lost (pending, outcome unknown, card charged). Another
// store A of the same app (a second account's directory, say) holds three
// paid intents; its index lists no file, only the count 3. A's index is
// copied over B's (a migration or a restore of the wrong file). At the
// next start, OpenDir(B) has nothing to stamp, the listing counts 3 record
// files as the index did, and every file the index does not hold is taken
// for resolved unread. Client.Unresolved and SettleAll return nothing:
// the charged payment is never settled or shown, start after start, as
// the copied index stays in place while nothing changes.
func settleAllAfterIndexCopiedFromAnotherStore(t *testing.T) {
	t.Parallel()
	srv := fakeserver.NewServer(nil)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	a := filepath.Join(t.TempDir(), "store-a")
	b := filepath.Join(t.TempDir(), "store-b")
	rtPay(t, srv, a, "a:", 3, false)
	rtPay(t, srv, b, "b:", 3, true)

	idx, err := os.ReadFile(filepath.Join(a, "index"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(b, "index"), idx, 0o600))

	store, err := persist.OpenDir(b, nil)
	require.NoError(t, err)
	defer store.Close()
	c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(),
		Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
	require.NoError(t, err)
	// Let the store's background listing end, as it does at any start.
	_, err = store.Get(ctx, "no-such-key")
	require.True(t, errors.Is(err, persist.ErrNotFound))

	settled, err := c.SettleAll(ctx)
	require.NoError(t, err)
	if len(settled) != 1 {
		t.Fatalf("SettleAll settled %d intents; the payment whose answer was lost (b:a) is hidden and never settled", len(settled))
	}
}
