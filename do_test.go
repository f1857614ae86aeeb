package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// storeDir is a file store in a fresh directory, and the directory.
func storeDir(t *testing.T, opts *persist.Options) (*persist.FileStore, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "intents")
	s, err := persist.OpenDir(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, dir
}

// TestDo keeps what a call of an intent does on the wire: one payment, one
// key, the same bytes, whatever the network does on the way.
func TestDo(t *testing.T) {
	t.Parallel()

	t.Run("it pays once and answers with the payment", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:1", 1500)
		assert.Equal(t, persist.StateNew, in.State())

		resp, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.False(t, resp.Replayed)
		assert.Equal(t, 1, resp.Attempts)
		p := decodePayment(t, resp.Body)
		assert.Equal(t, 1500, p.Amount)
		assert.Equal(t, persist.StateSucceeded, in.State())

		stats := e.srv.Stats()
		assert.Equal(t, 1, stats.Payments)
		assert.Equal(t, 1, stats.ProviderCharges)
		assert.Equal(t, 1, stats.Requests)
	})

	t.Run("each fault of the contract on the first attempt is retried with the same key and charged once", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name  string
			fault fakeserver.Fault // Key is set to the intent's
			opts  []idem.Option
			// wantAttempts is the call's attempts; 0 leaves them unchecked.
			wantAttempts int
			wantReplayed bool
			wantSleeps   []time.Duration // nil leaves them unchecked
			minWaited    time.Duration
			// seen is a status some attempt must have met; 0 for none.
			seen int
		}{
			{
				name:  "lost response: the retry is answered from the server's record",
				fault: fakeserver.Fault{Kind: fakeserver.FaultDropResponse}, wantAttempts: 2, wantReplayed: true,
			},
			{
				// Both dead-worker cases wait out a 30s lease within one Do;
				// without jitter, the waits and what the client-wide retry
				// budget refills in them are the same on every run (with
				// jitter, about one run in fifty draws waits too short for the
				// budget, and Do ends with the outcome unknown, to be resumed).
				name:  "crash after the provider charged: recovered, not charged again",
				fault: fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider},
				opts:  []idem.Option{idem.WithRetryPolicy(idem.RetryPolicy{Jitter: -1})},
			},
			{
				name:  "500: never stored, so the retry does the work",
				fault: fakeserver.Fault{Kind: fakeserver.FaultError}, wantAttempts: 2,
			},
			{
				name:  "connection reset before the request was read",
				fault: fakeserver.Fault{Kind: fakeserver.FaultReset}, wantAttempts: 2,
			},
			{
				name:         "409 with Retry-After: never sooner than the server asked",
				fault:        fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: http.StatusConflict, RetryAfter: "3", Count: 2},
				opts:         []idem.Option{idem.WithRetryPolicy(idem.RetryPolicy{InitialInterval: 100 * time.Millisecond, Jitter: -1})},
				wantAttempts: 3, wantSleeps: []time.Duration{3 * time.Second, 3 * time.Second},
			},
			{
				// The worker dies after inserting IN_PROGRESS: the next attempts
				// see 409 until the lease runs out, then take over and pay.
				name:  "worker crashed in progress: taken over after the lease",
				fault: fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert},
				opts:  []idem.Option{idem.WithRetryPolicy(idem.RetryPolicy{Jitter: -1})},
				seen:  http.StatusConflict, minWaited: 30 * time.Second,
			},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				var (
					mu   sync.Mutex
					seen []int
				)
				c := e.newClient(t, append(tc.opts, idem.WithAttemptHook(func(a idem.Attempt) {
					mu.Lock()
					seen = append(seen, a.StatusCode)
					mu.Unlock()
				}))...)
				in := e.newIntent(t, "checkout:fault", 1500)
				f := tc.fault
				f.Key = in.Key()
				e.fault(t, f)

				resp, err := c.Do(context.Background(), in)
				require.NoError(t, err)
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, tc.wantReplayed, resp.Replayed)
				if tc.wantAttempts != 0 {
					assert.Equal(t, tc.wantAttempts, resp.Attempts)
				}
				if tc.wantSleeps != nil {
					assert.Equal(t, tc.wantSleeps, e.clock.Sleeps())
				}
				var waited time.Duration
				for _, s := range e.clock.Sleeps() {
					waited += s
				}
				assert.GreaterOrEqual(t, waited, tc.minWaited)
				if tc.seen != 0 {
					assert.Contains(t, seen, tc.seen)
				}
				stats := e.srv.Stats()
				assert.Equal(t, 1, stats.ProviderCharges)
				assert.Equal(t, 1, stats.Payments)
				// The answer is the payment the server holds for the key.
				assert.Equal(t, e.lookup(t, in.Key()).ID, decodePayment(t, resp.Body).ID)
			})
		}
	})

	t.Run("every attempt sends the same bytes", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:bytes", 990)
		// Two lost responses and a 503: four attempts, one key, one body; the
		// server would answer 422 to any attempt whose body differed.
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key(), Count: 2})
		resp, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, 3, resp.Attempts)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// The first attempt's answer is lost and the retry carries a refreshed token;
	// the server scopes by the account the token names, so the retry replays, one
	// charge is made, and the lookup under yet another token finds the payment.
	t.Run("a token refreshed between attempts is the same caller", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		tokens := &refreshingToken{base: e.srv.Client().Transport}
		e.client = e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: tokens}))
		in := e.newIntent(t, "checkout:refresh", 1500)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})

		resp, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, 2, resp.Attempts)
		assert.True(t, resp.Replayed, "the refreshed token's retry got the first attempt's answer")
		assert.Equal(t, int64(2), tokens.n.Load(), "each attempt had its own token")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)

		lookup, err := http.NewRequest(http.MethodGet, lookupOf(e.srv.URL+"/payments", in.Key()), nil)
		require.NoError(t, err)
		found, err := (&http.Client{Transport: tokens}).Do(lookup)
		require.NoError(t, err)
		defer found.Body.Close()
		assert.Equal(t, http.StatusOK, found.StatusCode, "the lookup under a third token finds the payment")
	})

	t.Run("a double tap sends one request at a time", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{2, 50} {
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				t.Parallel()
				clk := clock.NewManual(epoch)
				// The payment takes a while, so that every tap lands while the
				// first is on the wire.
				srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk, ProcessingDelay: 20 * time.Millisecond})
				t.Cleanup(srv.Close)
				c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk))
				require.NoError(t, err)
				req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100, "currency": "AZN", "customer": "cus_1"})
				require.NoError(t, err)
				in, err := c.Intent(context.Background(), "checkout:tap", req)
				require.NoError(t, err)

				bodies := make([][]byte, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						resp, err := c.Do(context.Background(), in)
						errs[i] = err
						if resp != nil {
							bodies[i] = resp.Body
						}
					}()
				}
				wg.Wait()
				for i := range n {
					require.NoError(t, errs[i])
					assert.Equal(t, bodies[0], bodies[i], "every tap gets the same outcome")
				}
				stats := srv.Stats()
				assert.Equal(t, 1, stats.ProviderCharges)
				assert.Equal(t, 1, stats.Executions)
				// Taps that arrived during the first Do shared it; taps after it
				// were answered from the device. None went on the wire twice.
				assert.Equal(t, 1, stats.Requests)
			})
		}
	})

	// A Do of a never-sent intent that Client.Intent replaced for a changed
	// request returns ErrIntentReplaced and sends nothing.
	t.Run("an intent replaced for a changed request returns ErrIntentReplaced and sends nothing", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		old, err := e.client.Intent(ctx, "checkout:replaced", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.Intent(ctx, "checkout:replaced", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err)

		_, err = e.client.Do(ctx, old)
		require.ErrorIs(t, err, idem.ErrIntentReplaced)
		assert.Equal(t, 0, e.srv.Stats().Requests)
		assert.Equal(t, persist.StateNew, old.State(), "provably never sent")
	})

	t.Run("a decline is final and stored", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in, err := e.client.Intent(context.Background(), "checkout:declined", e.paymentRequest(t, 1500, "cus_declined"))
		require.NoError(t, err)

		resp, err := e.client.Do(context.Background(), in)
		var apiErr *idem.APIError
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, http.StatusPaymentRequired, apiErr.StatusCode)
		assert.Equal(t, "card-declined", lastSegment(apiErr.Problem.Type))
		require.NotNil(t, resp)
		assert.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
		assert.Equal(t, 1, resp.Attempts, "a business outcome is never retried")
		assert.Equal(t, persist.StateFailed, in.State())
		assert.Equal(t, 0, e.srv.Stats().ProviderCharges)

		again, err := e.client.Do(context.Background(), in)
		require.ErrorAs(t, err, &apiErr)
		assert.True(t, again.FromStore)
		assert.Equal(t, 1, e.srv.Stats().Requests)
	})

	t.Run("a key stored with another body is surfaced as key reuse with one request", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:422", 1500)
		_, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)

		// A bug elsewhere stores the same key with another body: the server
		// must refuse it, and the client must not retry the refusal.
		rec, err := e.store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		rec.Body = []byte(`{"amount":9999,"currency":"AZN","customer":"cus_1"}`)
		rec.State = persist.StateNew
		rec.Response = nil
		require.NoError(t, persisttest.Put(context.Background(), e.store, rec))
		before := e.srv.Stats().Requests
		// The next run of the app finds it in the store.
		in, err = e.newClient(t).Load(context.Background(), in.Key())
		require.NoError(t, err)

		resp, err := e.client.Do(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		var apiErr *idem.APIError
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
		assert.Equal(t, persist.StateRejected, in.State())
		assert.Equal(t, before+1, e.srv.Stats().Requests, "one request on the wire")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	t.Run("a key the server rejects is not retried", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk, RequireUUID: true})
		t.Cleanup(srv.Close)
		store := persist.NewMemory(nil)
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithStore(store), idem.WithClock(clk))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, context.Background(), in))
		// A key this server does not accept, as an app may choose its own.
		rec, err := store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		rec.Key, rec.KeyHeader = "not-a-uuid", "not-a-uuid"
		require.NoError(t, persisttest.Put(context.Background(), store, rec))
		old, err := c.Load(context.Background(), "not-a-uuid")
		require.NoError(t, err)

		_, err = c.Do(context.Background(), old)
		require.ErrorIs(t, err, idem.ErrKeyRejected)
		assert.NotErrorIs(t, err, idem.ErrKeyReused)
		assert.Equal(t, persist.StateRejected, old.State())
		assert.Equal(t, 1, srv.Stats().Requests)
	})

	// No retry fixes it.
	t.Run("a certificate the client does not trust is not retried", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
		srv := httptest.NewUnstartedServer(h)
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is the point
		srv.StartTLS()
		t.Cleanup(srv.Close)
		tr := &http.Transport{} // does not trust the test server's certificate
		t.Cleanup(tr.CloseIdleConnections)
		var attempts attemptLog
		c, err := idem.NewWith(idem.WithHTTPClient(&http.Client{Transport: tr}), idem.WithClock(clk), idem.WithAttemptHook(attempts.hook))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)

		_, err = c.Do(context.Background(), in)
		var notSent *idem.NotSentError
		require.ErrorAs(t, err, &notSent)
		assert.Len(t, attempts.all(), 1)
		assert.Empty(t, clk.Sleeps())
	})

	t.Run("a stale Intent value reads the store", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:stale", 1500)
		stale, err := e.client.Load(context.Background(), in.Key())
		require.NoError(t, err)
		_, err = e.client.Do(context.Background(), in)
		require.NoError(t, err)

		// stale's copy of the record still says "new", but it was sent: it
		// reads pending; the store says succeeded, and wins.
		assert.Equal(t, persist.StatePending, stale.State())
		resp, err := e.client.Do(context.Background(), stale)
		require.NoError(t, err)
		assert.True(t, resp.FromStore)
		assert.Equal(t, persist.StateSucceeded, stale.State())
		assert.Equal(t, 1, e.srv.Stats().Requests)
	})

	// The record counts the attempts of every call, not only the last one's.
	t.Run("the record counts the attempts of every call", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in := e.newIntent(t, "checkout:count", 100)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, Count: 2})
		for range 2 {
			_, err := e.client.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		}
		rec, err := e.store.Get(ctx, in.Key())
		require.NoError(t, err)
		assert.Equal(t, 2, rec.Attempts, "two failed calls, one attempt each")

		resp, err := e.client.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, 1, resp.Attempts, "this call's attempts")
		rec, err = e.store.Get(ctx, in.Key())
		require.NoError(t, err)
		assert.Equal(t, 3, rec.Attempts, "the intent's attempts")
	})

	t.Run("a nil intent is an error, never a panic", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		assert.NotPanics(t, func() {
			_, err := e.client.Do(context.Background(), nil)
			assert.Error(t, err)
		})
	})

	// The answer arrived and its save failed: Do and Send return the answer,
	// marked as not recorded, with the *SaveError; never "not sent".
	t.Run("an answer whose save failed is returned as not recorded", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		e.store = outcomeUnsaved{persist.NewMemory(nil)}
		c := e.newClient(t)
		resp, err := c.Send(ctx, "checkout:full", e.paymentRequest(t, 100, "cus_1"))
		require.NotNil(t, resp, "the answer is returned")
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.True(t, resp.NotRecorded)
		var saveErr *idem.SaveError
		require.ErrorAs(t, err, &saveErr)
		assert.Equal(t, "record outcome", saveErr.Op)
		assert.NotErrorIs(t, err, idem.ErrNotSent)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// It cuts the first connection of a payment at each point below HTTP, through
	// a TCP proxy: the cut attempt is an error, never a success, and the retry
	// with the same key ends with one charge and the answer the server stored.
	t.Run("a connection broken below HTTP is retried with the same key and charged once", func(t *testing.T) {
		t.Parallel()
		cuts := []faultproxy.Cut{
			{Point: faultproxy.InRequest, N: 0},
			{Point: faultproxy.InRequest, N: 40},  // in the request line or headers
			{Point: faultproxy.InRequest, N: 300}, // in the body, for a request longer than that
			{Point: faultproxy.AfterHeaders},
			{Point: faultproxy.InBody, N: 1},
			{Point: faultproxy.InBody, N: 60},
		}
		for _, encoding := range []string{"content-length", "chunked"} {
			for _, cut := range cuts {
				t.Run(encoding+"/"+cut.Point.String()+"-"+strconv.Itoa(cut.N), func(t *testing.T) {
					t.Parallel()
					testCut(t, cut, encoding == "chunked")
				})
			}
		}
	})

	// A call that ends without an answer closes the app's transport's idle
	// connections, as go-retryablehttp does, through the budget's wrapper.
	t.Run("a call that ends without an answer closes the transport's idle connections", func(t *testing.T) {
		t.Parallel()
		tr := &idleRecorder{}
		c, err := idem.NewWith(idem.WithHTTPClient(&http.Client{Transport: tr}), idem.WithClock(clock.NewManual(epoch)),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2}))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, "http://127.0.0.1:9/payments", map[string]any{"amount": 100})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)
		_, err = c.Do(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Positive(t, tr.closed.Load())
	})
	t.Run("a gateway's 4xx never settles, and the resend pays once", func(t *testing.T) {
		t.Parallel()
		for _, code := range []int{400, 401, 403, 404, 410, 413, 422} {
			t.Run(http.StatusText(code), func(t *testing.T) {
				_, srv, client := echoClient(t, persist.NewMemory(nil))
				ctx := context.Background()
				in, err := client.Intent(ctx, "checkout:gw", payment1500(t, srv))
				require.NoError(t, err)
				require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: code}))
				_, err = client.Do(ctx, in)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				require.False(t, in.State().Resolved(), "state %s", in.State())
				resp, err := client.Do(ctx, in)
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				require.Equal(t, 1, srv.Stats().ProviderCharges)
			})
		}
	})
}

// refreshingToken puts a new token of one account on every request, as an
// app whose OAuth access token is refreshed between attempts does.
type refreshingToken struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (rt *refreshingToken) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", fmt.Sprintf("Bearer test_acme_token-%d", rt.n.Add(1)))
	return rt.base.RoundTrip(r)
}

// TestRestart keeps what a new process finds of an intent the last one
// left unresolved.
func TestRestart(t *testing.T) {
	t.Parallel()

	t.Run("a new Client on the store resumes with the same key", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in := e.newIntent(t, "checkout:restart", 1500)
		key := in.Key()
		// The first process sends, the server charges, the answer is lost, and
		// the process gives up (one attempt allowed): the outcome is unknown.
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: key})
		e.clock.Advance(3 * time.Minute)
		_, err := e.client.Do(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Equal(t, persist.StatePending, in.State())
		assert.Equal(t, "pending", string(in.State()))
		assert.Equal(t, 1, in.Attempts())
		assert.Equal(t, epoch, in.CreatedAt())
		assert.Equal(t, epoch.Add(3*time.Minute), in.UpdatedAt(), "the attempt moved the intent on")

		// A new process: a new Client on the same store.
		restarted := e.newClient(t)
		pending, err := restarted.Unresolved(context.Background())
		require.NoError(t, err)
		require.Len(t, pending, 1)
		assert.Equal(t, key, pending[0].Key())

		resp, err := restarted.Do(context.Background(), pending[0])
		require.NoError(t, err)
		assert.True(t, resp.Replayed)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)

		// Resolved: Do answers from the device and sends nothing.
		before := e.srv.Stats().Requests
		again, err := restarted.Do(context.Background(), pending[0])
		require.NoError(t, err)
		assert.True(t, again.FromStore)
		assert.Equal(t, resp.Body, again.Body)
		assert.Equal(t, before, e.srv.Stats().Requests)
	})

	t.Run("on the file store the intent, its key and its bytes survive", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		clk := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
		t.Cleanup(srv.Close)
		dir := filepath.Join(t.TempDir(), "state") // OpenDir makes it 0700
		open := func(opts ...idem.Option) (*idem.Client, *persist.FileStore) {
			store, err := persist.OpenDir(dir, nil)
			require.NoError(t, err)
			c, err := idem.NewWith(append([]idem.Option{idem.WithStore(store), idem.WithHTTPClient(srv.Client()), idem.WithClock(clk)}, opts...)...)
			require.NoError(t, err)
			return c, store
		}

		first, store := open(idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 2500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := first.Intent(ctx, "checkout:file", req)
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
		_, err = first.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.NoError(t, store.Close())

		// The app starts again: the intent, its key and its bytes are on disk.
		next, store := open()
		defer store.Close()
		pending, err := next.Unresolved(ctx)
		require.NoError(t, err)
		require.Len(t, pending, 1)
		assert.Equal(t, in.Key(), pending[0].Key())
		assert.Equal(t, req.Body, pending[0].Request().Body)

		resp, err := next.Do(ctx, pending[0])
		require.NoError(t, err)
		assert.True(t, resp.Replayed)
		assert.Equal(t, 1, srv.Stats().ProviderCharges)

		// The same action after the restart finds the resolved intent.
		same, err := next.Intent(ctx, "checkout:file", req)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, same.State())
	})

	// A restart: the store is closed and opened again, and a new Client (its
	// count starting again at 1 under a new prefix) resumes the intent.
	t.Run("a Client remade after a restart resumes the intent once", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		dir := filepath.Join(t.TempDir(), "s")
		open := func(s *persist.FileStore) *idem.Client {
			c, err := idem.New(idem.Config{Store: s, HTTPClient: srv.Client(), Server: echoLookupServer, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
			require.NoError(t, err)
			return c
		}
		s1 := dirStore(t, dir)
		c := open(s1)
		in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.NoError(t, s1.Close())

		for range 2 {
			s := dirStore(t, dir)
			c = open(s)
			settled, err := c.SettleAll(ctx)
			require.NoError(t, err)
			t.Logf("settled %d", len(settled))
			require.NoError(t, s.Close())
		}
		s := dirStore(t, dir)
		t.Cleanup(func() { s.Close() })
		loaded, err := open(s).Load(ctx, in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, loaded.State())
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})
}

func lastSegment(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Path == "" {
		return s
	}
	p := u.Path
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// TestDoStops keeps where a call stops retrying, and what its RetryError
// says of it.
func TestDoStops(t *testing.T) {
	t.Parallel()

	t.Run("MaxAttempts ends the call", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 3}))
		in := e.newIntent(t, "checkout:attempts", 1500)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusBadGateway, Count: 10})
		_, err := e.client.Do(context.Background(), in)
		var retryErr *idem.RetryError
		require.ErrorAs(t, err, &retryErr)
		assert.Equal(t, idem.StopAttempts, retryErr.Reason)
		assert.Equal(t, 3, retryErr.Attempts)
		assert.Equal(t, 3, e.srv.Stats().Requests)
		assert.Len(t, e.clock.Sleeps(), 2)
		require.NotNil(t, retryErr.LastResponse)
		assert.Equal(t, http.StatusBadGateway, retryErr.LastResponse.StatusCode)

		rec, err := e.store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		assert.Equal(t, 3, rec.Attempts)
		assert.Equal(t, persist.StatePending, rec.State)
	})

	t.Run("a Retry-After above the cap fails fast", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:cap", 1500)
		// Ten years.
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusTooManyRequests, RetryAfter: "315360000"})
		_, err := e.client.Do(context.Background(), in)
		var retryErr *idem.RetryError
		require.ErrorAs(t, err, &retryErr)
		assert.Equal(t, idem.StopRetryAfterCap, retryErr.Reason)
		assert.Equal(t, 315360000*time.Second, retryErr.Wait)
		assert.Empty(t, e.clock.Sleeps())
	})

	// The budget compares the injected clock's times with the context's
	// deadline, which is on the real clock. Whatever the manual clock reads,
	// years before or after today, a context with 10 s left refuses a 50 s
	// Retry-After at once and honours a 3 s one.
	t.Run("the context's deadline is read on the injected clock's timeline", func(t *testing.T) {
		t.Parallel()
		starts := map[string]time.Time{
			"clock 20 years back":   time.Now().AddDate(-20, 0, 0),
			"clock at the epoch":    epoch,
			"clock 30 years ahead":  time.Now().AddDate(30, 0, 0),
			"clock at the zero day": time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Hour),
		}
		for name, start := range starts {
			t.Run(name+"/Retry-After past the deadline fails fast", func(t *testing.T) {
				t.Parallel()
				e := newEnvAt(t, start)
				in := e.newIntent(t, "checkout:deadline", 1500)
				e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, RetryAfter: "50"})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()

				_, err := e.client.Do(ctx, in)
				var retryErr *idem.RetryError
				require.ErrorAs(t, err, &retryErr)
				assert.Equal(t, idem.StopDeadline, retryErr.Reason)
				assert.Equal(t, 50*time.Second, retryErr.Wait, "the error carries the wait the server asked for")
				assert.Equal(t, 1, retryErr.Attempts)
				require.NotNil(t, retryErr.LastResponse)
				assert.Equal(t, http.StatusServiceUnavailable, retryErr.LastResponse.StatusCode)
				assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				assert.ErrorIs(t, err, context.DeadlineExceeded, "the caller's deadline ended the call, though no attempt ran into it")
				assert.Empty(t, e.clock.Sleeps(), "gave up without waiting")
				assert.Equal(t, persist.StatePending, in.State())
			})
			t.Run(name+"/Retry-After within the deadline is honoured", func(t *testing.T) {
				t.Parallel()
				e := newEnvAt(t, start, idem.WithRetryPolicy(idem.RetryPolicy{Jitter: -1}))
				in := e.newIntent(t, "checkout:deadline", 1500)
				e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, RetryAfter: "3", Count: 1})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()

				resp, err := e.client.Do(ctx, in)
				require.NoError(t, err)
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, []time.Duration{3 * time.Second}, e.clock.Sleeps())
			})
		}
	})

	// The error of a call that gave up carries the last answer's body.
	t.Run("the error keeps the last answer's body", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2}))
		in := e.newIntent(t, "checkout:body", 100)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, Count: 2})
		_, err := e.client.Do(context.Background(), in)
		var retryErr *idem.RetryError
		require.ErrorAs(t, err, &retryErr)
		require.NotNil(t, retryErr.LastResponse)
		assert.Contains(t, string(retryErr.LastResponse.Body), "the status fault answered this request")
	})

	// A Retry-After that would land the next attempt past the intent's expiry
	// ends the call there: the key is never sent after it.
	t.Run("no attempt leaves after the intent's expiry", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:late", 100)
		e.clock.Advance(sendWindow - 5*time.Second)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, RetryAfter: "10"})

		_, err := e.client.Do(context.Background(), in)
		var retryErr *idem.RetryError
		require.ErrorAs(t, err, &retryErr)
		assert.Equal(t, idem.StopExpired, retryErr.Reason)
		assert.Equal(t, 1, e.srv.Stats().Requests)
		assert.Empty(t, e.clock.Sleeps())
		assert.Equal(t, persist.StateExpired, in.State())
		rec, err := e.store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateExpired, rec.State)
	})

	t.Run("an expired intent sends nothing and the lookup voids it", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:old", 1500)
		e.clock.Advance(sendWindow)

		_, err := e.client.Do(context.Background(), in)
		requireStop(t, err, idem.StopExpired)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Equal(t, persist.StateExpired, in.State())
		assert.Equal(t, 0, e.srv.Stats().Requests)

		// Reconcile settles it: the server never saw the key, and the intent
		// is old, so nothing happened.
		_, err = e.client.Reconcile(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateVoid, in.State())
		assert.Equal(t, 0, e.srv.Stats().ProviderCharges)
	})

	// An answer the server marks as replayed from its record is final,
	// whatever its status, so the call ends with it instead.
	t.Run("the last answer in its error is never a replay", func(t *testing.T) {
		t.Parallel()
		for _, replayed := range []bool{false, true} {
			c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
				if replayed {
					w.Header().Set("Idempotent-Replayed", "true")
				}
				w.WriteHeader(http.StatusTooManyRequests)
			}, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
			in, err := c.NewIntent(context.Background(), "", req)
			require.NoError(t, err)
			resp, err := c.Do(context.Background(), in)
			var retryErr *idem.RetryError
			if !replayed {
				require.ErrorAs(t, err, &retryErr)
				require.NotNil(t, retryErr.LastResponse)
				assert.False(t, retryErr.LastResponse.Replayed)
				continue
			}
			assert.False(t, errors.As(err, &retryErr), "a replay is final")
			require.NotNil(t, resp)
			assert.True(t, resp.Replayed)
		}
	})
}

// blockingClock waits in Sleep until the context is done, and says when it
// starts waiting: a wait that only a cancel can end.
type blockingClock struct {
	*clock.Manual
	waiting chan time.Duration
}

func (c blockingClock) Sleep(ctx context.Context, d time.Duration) error {
	c.waiting <- d
	<-ctx.Done()
	return ctx.Err()
}

// TestDoCancel keeps what a call whose context ends leaves behind: what it
// learned is saved, and it claims no more than its record says.
func TestDoCancel(t *testing.T) {
	t.Parallel()

	t.Run("a cancel during a wait returns the context's error with the outcome unknown", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		clk := blockingClock{Manual: e.clock, waiting: make(chan time.Duration, 1)}
		c := e.newClient(t, idem.WithClock(clk))
		in := e.newIntent(t, "checkout:cancel", 1500)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, RetryAfter: "30"})

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := c.Do(ctx, in)
			done <- err
		}()
		waited := <-clk.waiting
		assert.GreaterOrEqual(t, waited, 30*time.Second, "never sooner than Retry-After")
		assert.LessOrEqual(t, waited, 33*time.Second, "spread by at most 10% past it")
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		var retryErr *idem.RetryError
		require.ErrorAs(t, err, &retryErr)
		assert.Equal(t, idem.StopCanceled, retryErr.Reason)
		assert.Equal(t, 1, retryErr.Attempts)
		assert.Equal(t, 1, e.srv.Stats().Requests)
	})

	t.Run("a final answer that arrives as the call is cancelled is kept", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: cancelAfterAnswer{e.srv.Client().Transport, cancel}}))
		in, err := c.NewIntent(context.Background(), "checkout:late", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)

		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, persist.StateSucceeded, in.State(), "the answer in hand is recorded, not thrown away")
		rec, err := e.store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, rec.State)
	})

	// The call's context is cancelled once the server's final answer
	// is in hand: the outcome must still be saved.
	t.Run("the outcome is saved after a cancel", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		e := newEnv(t)
		c := e.newClient(t, idem.WithAttemptHook(func(a idem.Attempt) {
			if a.StatusCode == http.StatusCreated {
				cancel()
			}
		}))
		in := e.newIntent(t, "checkout:cancel-late", 100)
		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		rec, err := e.store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, rec.State)
	})

	t.Run("the attempts are saved after a cancel", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		e := newEnv(t)
		c := e.newClient(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}), idem.WithAttemptHook(func(a idem.Attempt) {
			if !a.Retry {
				cancel()
			}
		}))
		in := e.newIntent(t, "checkout:cancel-gave-up", 100)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable})
		_, err := c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.NotErrorAs(t, err, new(*idem.SaveError))
		rec, err := e.store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StatePending, rec.State)
		assert.Equal(t, 1, rec.Attempts)
	})

	// An intent found too old to send by a call whose context has already
	// ended is expired all the same: the call says so, not that the context
	// ended it, and the store records it, so the app settles it through the
	// lookup rather than calling Do again for ever.
	t.Run("the expiry is saved after a cancel", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			ended func(t *testing.T) context.Context
		}{
			{"canceled", func(*testing.T) context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			}},
			{"deadline passed", func(t *testing.T) context.Context {
				ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
				t.Cleanup(cancel)
				return ctx
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
				in := e.newIntent(t, "checkout:expired-"+tc.name, 1500)
				e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable})
				_, err := e.client.Do(context.Background(), in)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				require.Equal(t, persist.StatePending, in.State())

				e.clock.Advance(sendWindow)
				_, err = e.client.Do(tc.ended(t), in)
				requireStop(t, err, idem.StopExpired)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				assert.NotErrorIs(t, err, context.Canceled)
				assert.NotErrorIs(t, err, context.DeadlineExceeded)
				assert.NotErrorAs(t, err, new(*idem.SaveError))
				assert.Equal(t, persist.StateExpired, in.State())
				rec, err := e.store.Get(context.Background(), in.Key())
				require.NoError(t, err)
				assert.Equal(t, persist.StateExpired, rec.State)
				assert.Equal(t, 1, e.srv.Stats().Requests)
			})
		}
	})

	// A call that put nothing on the wire leaves the intent new.
	t.Run("a call that sent nothing leaves the intent new", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:never", 100)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := e.client.Do(ctx, in)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, persist.StateNew, in.State())
		assert.Equal(t, 0, e.srv.Stats().Requests)
	})

	// A Do that cannot read the intent's record, its context ended, says what
	// the record it holds says: one that may have been sent (armed, sent
	// since by another value of the intent) ends with its outcome unknown as
	// well as the context's error; one stored not sent does not claim an
	// outcome unknown, nor that it was not sent, which the unread store may
	// no longer say. Nothing is sent.
	t.Run("a call that cannot read the store says whether the outcome may be unknown", func(t *testing.T) {
		t.Parallel()
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		t.Run("may have been sent", func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			in := e.newIntent(t, "checkout:unread", 1500)
			stale, err := e.client.Load(context.Background(), in.Key())
			require.NoError(t, err)
			e.unknownOutcome(t, in, fakeserver.FaultDropResponse)
			_, err = e.client.Do(ended, stale)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			require.ErrorIs(t, err, context.Canceled)
			assert.NotErrorIs(t, err, idem.ErrNotSent)
			assert.Equal(t, 1, e.srv.Stats().Requests)
		})
		t.Run("stored not sent", func(t *testing.T) {
			t.Parallel()
			refused := httptest.NewServer(http.NotFoundHandler())
			refused.Close() // nothing listens there now
			store := persist.NewMemory(nil)
			c, err := idem.NewWith(idem.WithStore(store), idem.WithClock(clock.NewManual(epoch)), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "checkout:unread", idem.Request{Method: http.MethodPost, URL: refused.URL, Body: []byte(`{}`)})
			require.NoError(t, err)
			_, err = c.Do(context.Background(), in)
			require.ErrorIs(t, err, idem.ErrNotSent)
			stale, err := c.Load(context.Background(), in.Key())
			require.NoError(t, err)
			require.Equal(t, persist.StateNotSent, stale.State())
			_, err = c.Do(ended, stale)
			require.ErrorIs(t, err, context.Canceled)
			assert.NotErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.NotErrorIs(t, err, idem.ErrNotSent)
		})
	})
}

// cancelAfterAnswer reads each answer in full, then cancels the call's
// context before handing the answer on: the answer arrived just as the
// user gave up, and what it says must still be kept.
type cancelAfterAnswer struct {
	base   http.RoundTripper
	cancel context.CancelFunc
}

func (c cancelAfterAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	c.cancel()
	return resp, nil
}

// outcomeUnsaved is a store that saves the tap's write and fails every
// later one, as a disk that fills up right after a payment.
type outcomeUnsaved struct{ persist.Store }

func (s outcomeUnsaved) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec.State != persist.StateNew {
		return errDiskFull
	}
	return s.Store.Write(ctx, rec, old)
}

// TestDoMark keeps what a call takes for the server's word: only an answer
// the server marked settles an intent, on the first attempt as on a retry.
func TestDoMark(t *testing.T) {
	t.Parallel()

	// The first attempt of an intent nothing can have sent before needs the
	// server's mark as any other: an unmarked 2xx is not a payment (a captive
	// portal's 200 login page answers the first POST of a phone on hotel
	// Wi-Fi), and an unmarked 4xx is not a refusal (a WAF's response rule may
	// swap the server's 201 for its own 403 after the server charged). A
	// replay that echoes the key is final whatever its status.
	t.Run("the first attempt needs the mark as any other", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name   string
			status int
			header map[string]string
			state  persist.State
			reason idem.StopReason
		}{
			{"unmarked 403 is not a refusal", http.StatusForbidden, nil, persist.StatePending, idem.StopUnmarked},
			{"unmarked 400 is not a refusal", http.StatusBadRequest, nil, persist.StatePending, idem.StopUnmarked},
			{"an echoed 403 is final", http.StatusForbidden, map[string]string{"Idempotency-Key": "{key}"}, persist.StateFailed, ""},
			{"unmarked 200 is not a payment", http.StatusOK, nil, persist.StatePending, idem.StopUnmarked},
			{"unmarked 201 is not a payment", http.StatusCreated, nil, persist.StatePending, idem.StopUnmarked},
			// The replay header alone names no intent: a cache that kept
			// another intent's replay serves it to every POST of the URL.
			{"a replay that echoes no key is not final", http.StatusOK, map[string]string{"Idempotent-Replayed": "true"}, persist.StatePending, idem.StopUnmarked},
			{"an echoed 201 is final", http.StatusCreated, map[string]string{"Idempotency-Key": "{key}"}, persist.StateSucceeded, ""},
			{"a quoted echo is final", http.StatusCreated, map[string]string{"Idempotency-Key": `"{key}"`}, persist.StateSucceeded, ""},
			{"another key's echo is not", http.StatusCreated, map[string]string{"Idempotency-Key": "someone-else"}, persist.StatePending, idem.StopUnmarked},
			// A cache on the path that kept another intent's replay and serves
			// it to every POST of the URL.
			{"another key's replay is not", http.StatusCreated, map[string]string{"Idempotent-Replayed": "true", "Idempotency-Key": "someone-else"}, persist.StatePending, idem.StopUnmarked},
			{"a replay with this key's echo is final", http.StatusCreated, map[string]string{"Idempotent-Replayed": "true", "Idempotency-Key": "{key}"}, persist.StateSucceeded, ""},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
					for k, v := range tc.header {
						w.Header().Set(k, strings.ReplaceAll(v, "{key}", r.Header.Get("Idempotency-Key")))
					}
					strangerPage(w, tc.status, "text/html", "<html>page</html>")
					return true
				})
				c := f.client(t)
				in, err := c.Intent(ctx, "checkout", f.payment(t, 1500))
				require.NoError(t, err)
				_, err = c.Do(ctx, in)
				if tc.reason != "" {
					requireStop(t, err, tc.reason)
				}
				assert.Equal(t, tc.state, in.State())
			})
		}

		// Path: a WAF with response-phase rules (ModSecurity phase 4, a
		// data-leak filter) forwards the first attempt, the server charges and
		// answers 201, and the WAF swaps that answer for its own 403 page,
		// without the echo. Were an unmarked 4xx final on a first attempt, the
		// 403 would settle the intent failed: the app is told "failed" for a
		// payment that was made, and the user pays again with a new intent.
		t.Run("a WAF's 403 that replaced the server's 201 never settles", func(t *testing.T) {
			t.Parallel()
			srv, proxy := rewritingProxy(t, func(resp *http.Response) error {
				// The WAF's response rule fires on the server's answer.
				resp.Body.Close()
				body := "<html><body>Request blocked by security policy</body></html>"
				resp.StatusCode, resp.Status = http.StatusForbidden, "403 Forbidden"
				resp.Header = http.Header{"Content-Type": {"text/html"}}
				resp.Body = io.NopCloser(strings.NewReader(body))
				resp.ContentLength = int64(len(body))
				return nil
			})
			waf := httptest.NewServer(proxy)
			defer waf.Close()
			c, err := idem.New(idem.Config{Store: persist.NewMemory(nil), Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
			require.NoError(t, err)
			req, _ := idem.JSONRequest(http.MethodPost, waf.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			in, err := c.NewIntent(context.Background(), "checkout:cart-3", req)
			require.NoError(t, err)
			_, err = c.Do(context.Background(), in)
			require.Equal(t, 1, srv.Stats().ProviderCharges, "setup: the server charged")
			requireStop(t, err, idem.StopUnmarked)
			assert.False(t, in.State().Resolved(), "the card was charged: the WAF's 403 is not the server's word")
		})
	})

	// An app whose server cannot mark its answers says how to recognise them;
	// its recognizer (idem.MarkRecognizer) stands for the echo.
	t.Run("a MarkRecognizer recognises an unmarked server's answers", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var posts atomic.Int32
		f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodPost {
				return false
			}
			if posts.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return true
			}
			w.Header().Set("X-Served-By", "payments")
			strangerPage(w, http.StatusPaymentRequired, "application/json", `{"error":"declined"}`)
			return true
		})
		c := f.client(t, idem.WithServer(idem.Server{Lookup: contractLookup, Mark: idem.MarkRecognizer(func(resp *idem.Response) bool { return resp.Header.Get("X-Served-By") == "payments" })}),
			idem.WithRetryPolicy(idem.RetryPolicy{Jitter: -1}))
		in, err := c.Intent(ctx, "checkout", f.payment(t, 1500))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		var apiErr *idem.APIError
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, persist.StateFailed, in.State())
	})

	// A gateway's refusal of a retry is not "not paid": the first attempt
	// charged and its answer was lost, the retry got the gateway's own 401,
	// 403 or 407 (or a 200 login page), which does not echo the key. The call
	// ends with the outcome unknown, naming the unmarked answer; Settle later
	// gets the server's replay, and the user pays once.
	t.Run("a stranger's answer to a retry leaves the outcome unknown", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name        string
			status      int
			contentType string
			body        string
		}{
			{"gateway 401", http.StatusUnauthorized, "application/json", `{"message":"Unauthorized"}`},
			{"WAF 403", http.StatusForbidden, "text/html", "<html>Request blocked</html>"},
			{"proxy 407", http.StatusProxyAuthRequired, "text/html", "<html>Proxy login</html>"},
			{"login page 200", http.StatusOK, "text/html", "<html>Sign in to the Wi-Fi</html>"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				var posts atomic.Int32
				var f *front
				f = newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
					if r.Method != http.MethodPost {
						return false
					}
					switch posts.Add(1) {
					case 1:
						// The origin charges; the answer is lost on the way.
						require.NoError(t, f.origin.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: r.Header.Get("Idempotency-Key")}))
						return false
					case 2:
						strangerPage(w, tc.status, tc.contentType, tc.body)
						return true
					}
					return false
				})
				c := f.client(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 5, Jitter: -1}))
				in, err := c.Intent(ctx, "checkout", f.payment(t, 1500))
				require.NoError(t, err)

				_, err = c.Do(ctx, in)
				var re *idem.RetryError
				require.ErrorAs(t, err, &re)
				assert.Equal(t, idem.StopUnmarked, re.Reason)
				require.NotNil(t, re.LastResponse)
				assert.Equal(t, tc.status, re.LastResponse.StatusCode)
				assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				var apiErr *idem.APIError
				assert.NotErrorAs(t, err, &apiErr, "a stranger's answer is not the server's final answer")
				assert.EqualValues(t, 2, posts.Load(), "the call ends at once on the unmarked answer")
				assert.Equal(t, persist.StatePending, in.State())
				assert.Equal(t, 1, f.origin.Stats().Payments)

				// The changed cart must wait.
				_, err = c.Intent(ctx, "checkout", f.payment(t, 2500))
				var unresolved *idem.UnresolvedError
				require.ErrorAs(t, err, &unresolved)

				resp, err := c.Settle(ctx, in)
				require.NoError(t, err)
				assert.True(t, resp.Replayed)
				assert.Equal(t, persist.StateSucceeded, in.State())
				assert.Equal(t, 1, f.origin.Stats().Payments, "paid once")
			})
		}
	})

	// A captive portal's 200 whose header fields alone pass the Client's limit
	// on an answer (a long Set-Cookie, a content security policy) is as much a
	// stranger's as any unmarked 200: over the limit or not, it is not a
	// payment, and the intent stays pending.
	t.Run("an unmarked success over the limit is not a payment", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Set-Cookie", "portal="+strings.Repeat("x", 2048))
			strangerPage(w, http.StatusOK, "text/html", "<html>log in</html>")
			return true
		})
		c := f.client(t, idem.WithServer(idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key", MaxResponseBytes: 1024}))
		in, err := c.Intent(ctx, "checkout", f.payment(t, 1500))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		requireStop(t, err, idem.StopUnmarked)
		assert.Equal(t, persist.StatePending, in.State())
	})

	// A gateway copies every request header, the attempt's nonce (the record's
	// version) and the key among them, into its own 200 page; a cache then
	// serves that page to the next attempt, with the earlier attempt's nonce.
	// Neither settles the intent.
	t.Run("a reflection with an earlier attempt's nonce settles nothing", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		var kept atomic.Pointer[http.Header]
		gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := r.Header.Clone()
			if k := kept.Load(); k != nil {
				h = *k // the cached page, with the first attempt's headers
			} else {
				kept.Store(&h)
			}
			for k, v := range h {
				w.Header()[k] = v
			}
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("<html>Sign in to the Wi-Fi</html>"))
		}))
		t.Cleanup(gw.Close)
		c, err := idem.New(idem.Config{HTTPClient: gw.Client(), Server: echoLookupServer, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second}})
		require.NoError(t, err)
		req := payment1500(t, srv)
		req.URL = gw.URL + "/payments"
		in, err := c.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		for range 2 {
			_, err = c.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.False(t, in.State().Resolved(), "state %s", in.State())
		}
	})
}

// notSentFails is a store whose writes of a not-sent record fail, as a
// full disk's do.
type notSentFails struct{ persist.Store }

func (s notSentFails) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec.State == persist.StateNotSent {
		return errStoreDown
	}
	return s.Store.Write(ctx, rec, old)
}

func TestNotSent(t *testing.T) {
	t.Parallel()
	t.Run("a not-sent that could not be saved is never told not sent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		hc, down := switchable()
		c := e.newClient(t, idem.WithHTTPClient(hc), idem.WithStore(notSentFails{e.store}))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)

		down.Store(true) // offline, and the disk is full
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.NotErrorIs(t, err, idem.ErrNotSent, "the store does not say so: the user is not told so")
		require.ErrorAs(t, err, new(*idem.SaveError))

		// The store still holds the intent armed: the next start settles
		// it, which the user, told the outcome is unknown, expects.
		down.Store(false)
		next := e.newClient(t)
		out, err := next.SettleAll(ctx)
		require.NoError(t, err)
		require.Len(t, out, 1)
		require.NoError(t, out[0].Err)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
}

// TestResolvedRecord: what one Client records of a call (its attempts,
// its expiry) never overwrites the answer another Client on the store
// recorded meanwhile; the call tells that answer instead.
func TestResolvedRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// expire makes client a's call end expired once b has resolved
		// the intent, rather than with its attempts.
		expire bool
	}{
		{"is never overwritten by another Client's attempts", false},
		{"is never overwritten by another Client's expiry", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t)
			in := e.newIntent(t, "checkout:resolved-by-b", 1500)
			e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, Count: 1})
			b := e.newClient(t)
			resolved := false
			a := e.newClient(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}), idem.WithAttemptHook(func(idem.Attempt) {
				if resolved {
					return
				}
				resolved = true
				// a's one attempt got the 503; b, the other Client on
				// the store, resumes the intent and gets the answer.
				bin, err := b.Load(ctx, in.Key())
				require.NoError(t, err)
				resp, err := b.Do(ctx, bin)
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				if tc.expire {
					e.clock.Advance(sendWindow)
				}
			}))
			ain, err := a.Load(ctx, in.Key())
			require.NoError(t, err)
			resp, err := a.Do(ctx, ain)
			require.NoError(t, err, "a's call tells b's answer")
			assert.True(t, resp.FromStore)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, persist.StateSucceeded, ain.State())

			rec, err := e.store.Get(ctx, in.Key())
			require.NoError(t, err)
			assert.Equal(t, persist.StateSucceeded, rec.State, "b's answer stays stored")
			require.NotNil(t, rec.Response)
			assert.Equal(t, http.StatusCreated, rec.Response.StatusCode)
			assert.Equal(t, 1, e.srv.Stats().Payments)
		})
	}

	// Client A's attempt begins in time, but a proxy queues it past
	// ReconcileDelay (the limit Server.ReconcileDelay documents). Client B on
	// the same store voids the intent meanwhile from the lookup's typed miss.
	// The request then reaches the server, which charges and answers A 201
	// with the key's echo. A's save of that answer conflicts with the stored
	// void. The answer in hand is the truth: A records it over the void and
	// returns it. Told void, the app would charge the user again.
	t.Run("the server's answer in hand wins over another Client's stored void", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv, store := phoneStore(t)
		server := echoLookupServer
		b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth})
		require.NoError(t, err)

		proxy := proxyTo(t, srv)
		var voided atomic.Bool
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				// The proxy's queue holds the request ten minutes; meanwhile B
				// settles the intent through the lookup, straight to the server.
				truth.Advance(10 * time.Minute)
				loaded, err := b.Load(ctx, r.Header.Get("Idempotency-Key"))
				if err == nil {
					_, err = b.Reconcile(ctx, loaded)
					voided.Store(loaded.State() == persist.StateVoid)
				}
				t.Logf("B's reconcile while the proxy holds A's request: err %v", err)
			}
			proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(front.Close)

		a, err := idem.New(idem.Config{Store: store, HTTPClient: front.Client(), Server: server, Clock: truth,
			OnAttempt:   func(at idem.Attempt) { t.Logf("A's attempt %d: %d", at.Number, at.StatusCode) },
			RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		req := payment1500(t, srv)
		req.URL = front.URL + "/payments"
		in, err := a.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		resp, err := a.Do(ctx, in)
		t.Logf("A's Do: resp %v, err %v, state %s", resp != nil, err, in.State())
		require.True(t, voided.Load(), "the setup: B voided the intent while the request was queued")
		require.Equal(t, 1, srv.Stats().ProviderCharges, "the setup: the queued request charged")

		assert.NotEqual(t, persist.StateVoid, in.State(), "A holds the server's 201 yet reports void")
		require.NoError(t, err, "A holds the server's 201 for its key")
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.False(t, resp.NotRecorded, "the answer is written over the void")
		stored, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, stored.State(), "the store holds the server's answer, not the void")
	})

	// B voids the intent while A's POST is held; the POST is charged, and A's
	// dispute writes the 201 over the void. B's app still holds its void
	// Intent. Its Settle reads the store, which says succeeded, and never
	// tells void.
	t.Run("a void written over is never told from a stale Intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newHeldWorld(t, "cus_1", false)
		a, b, srv, in := w.a, w.b, w.srv, w.in
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		require.Equal(t, persist.StateVoid, loaded.State(), "the setup: B's app holds the void")
		t.Logf("A's Do: err %v, state %s", w.release(), in.State())
		require.Equal(t, 1, srv.Stats().ProviderCharges)
		stored, err := a.Load(ctx, in.Key())
		require.NoError(t, err)
		t.Logf("stored: %s", stored.State())

		resp, err := b.Settle(ctx, loaded)
		t.Logf("B's Settle: resp %v, err %v, state %s", resp != nil, err, loaded.State())
		assert.False(t, err == nil && loaded.State() == persist.StateVoid, "Settle tells void; the store says %s and the server charged", stored.State())
	})

	// A front holds A's POST past every bound, and B voids the intent. The
	// server then charges and answers 201. A's arbitration cannot settle
	// the dispute: the front answers the lookup with its own 503, or the
	// write over the void fails once (a full disk). A is told the outcome
	// is unknown. The intent must not stay void: the later Settle asks the
	// server, which has the payment.
	t.Run("a dispute the lookup cannot settle is never told void later", func(t *testing.T) {
		t.Parallel()
		disputeUnsettled(t, false, func(front *holdingFront, _ *flakyWrites) { front.failLookups.Store(1) })
	})
	t.Run("a dispute whose answer cannot be written over the void is never told void later", func(t *testing.T) {
		t.Parallel()
		disputeUnsettled(t, false, func(_ *holdingFront, store *flakyWrites) {
			store.failAt = 2 // the first write meets the void; the second is overVoid's
			store.armed.Store(true)
		})
	})
	// Settle meets the same dispute, and neither the answer nor the expired
	// record can be written over the void. The void stays stored, but
	// Settle never tells it: the outcome is unknown. Once the disk has
	// room again, the Client's next Load or Settle writes the server's word
	// over the void.
	t.Run("a Settle whose dispute cannot be written is never told void", func(t *testing.T) {
		t.Parallel()
		disputeUnsettled(t, true, func(_ *holdingFront, store *flakyWrites) {
			store.failAt, store.failAlso = 2, 3 // overVoid's writes: the answer's, then the expired record's
			store.armed.Store(true)
		})
	})

	// A's POST never reaches the server: a gateway holds it, and B voids
	// the intent from the server's typed miss (true: nothing charged). The
	// gateway then answers A with its own 201, copying only the request's
	// Idempotency-Key. Under MarkEcho that looks like the server's word.
	// The server's lookup settles the dispute: it has no record of the key,
	// so the void stays and A tells it.
	for _, tc := range []struct {
		name   string
		lookup bool // the lookup reaches the server
	}{
		{"a front's copy of the key never overwrites the server's void", true},
		{"a front's copy of the key is an unknown outcome when the lookup settles nothing", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			truth, srv, store := phoneStore(t)
			server := echoLookupServer
			b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth})
			require.NoError(t, err)
			proxy := proxyTo(t, srv)
			var voided, blocked atomic.Bool
			var posts atomic.Int32
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || posts.Add(1) > 1 { // a later POST reaches the server
					if r.Method == http.MethodPost {
						proxy.ServeHTTP(w, r)
						return
					}
					if blocked.Load() {
						http.Error(w, "bad gateway", http.StatusBadGateway)
						return
					}
					proxy.ServeHTTP(w, r)
					return
				}
				truth.Advance(10 * time.Minute)
				loaded, err := b.Load(ctx, r.Header.Get("Idempotency-Key"))
				if err == nil {
					_, err = b.Reconcile(ctx, loaded)
					voided.Store(loaded.State() == persist.StateVoid)
				}
				t.Logf("B's reconcile while the gateway holds A's request: err %v", err)
				blocked.Store(!tc.lookup)
				w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, `{"id":"pay_gateway","status":"succeeded"}`)
			}))
			t.Cleanup(front.Close)
			a, err := idem.New(idem.Config{Store: store, HTTPClient: front.Client(), Server: server, Clock: truth,
				RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
			require.NoError(t, err)
			req := payment1500(t, srv)
			req.URL = front.URL + "/payments"
			in, err := a.Intent(ctx, "checkout", req)
			require.NoError(t, err)
			resp, doErr := a.Do(ctx, in)
			t.Logf("A's Do: resp %v, err %v, state %s", resp != nil, doErr, in.State())
			require.True(t, voided.Load(), "the setup: B voided the intent from the server's typed miss")
			require.Equal(t, 0, srv.Stats().ProviderCharges, "the setup: nothing charged")

			require.Error(t, doErr, "A is never told paid for an intent the server never charged")
			assert.Nil(t, resp, "the gateway's answer is not told")
			stored, err := b.Load(ctx, in.Key())
			require.NoError(t, err)
			if !tc.lookup {
				// The dispute stands: the intent is stored expired, never
				// sent again, and the next lookup settles it.
				assert.ErrorIs(t, doErr, idem.ErrOutcomeUnknown)
				assert.Equal(t, persist.StateExpired, stored.State(), "a dispute the lookup could not settle is an unknown outcome, never void")
				assert.Equal(t, persist.StateExpired, in.State())
				blocked.Store(false)
				_, err = b.Settle(ctx, stored)
				require.NoError(t, err)
				assert.Equal(t, 0, srv.Stats().ProviderCharges, "Settle asks the lookup; it never sends the intent again")
			}
			assert.Equal(t, persist.StateVoid, stored.State(), "the server's void stays, or the lookup finds it again")
		})
	}

	// A's POST is held, and B voids it from the server's miss. The user
	// changes the cart, and the changed cart is declined. Then the held
	// POST lands and is charged, and its payment is written over the void.
	// It is written at the action's end, so the next tap finds the action
	// paid, and sends nothing.
	t.Run("a payment written over a void behind a decline is the action's latest", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := overruledWorldWith(t, false, func(w *overruledWorld) {
			req, err := idem.JSONRequest(http.MethodPost, w.fs.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_declined"})
			require.NoError(t, err)
			declined, err := w.a.Intent(ctx, "checkout", req)
			require.NoError(t, err, "the setup: the action's latest is void, so a changed cart is a new intent")
			_, err = w.a.Do(ctx, declined)
			t.Logf("the declined cart: %v", err)
			require.Equal(t, persist.StateFailed, declined.State(), "the setup: the second cart was declined")
		})
		first, err := w.a.Load(ctx, w.in.Key())
		require.NoError(t, err)
		require.Equal(t, persist.StateSucceeded, first.State(), "the setup: the first intent is paid")

		req, err := idem.JSONRequest(http.MethodPost, w.fs.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		again, err := w.a.Intent(ctx, "checkout", req)
		if err == nil {
			_, err = w.a.Do(ctx, again)
		}
		t.Logf("the third tap: err %v; charges %d", err, w.srv.Stats().ProviderCharges)
		var resolved *idem.ResolvedError
		assert.ErrorAs(t, err, &resolved, "the action is paid")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges, "an action already paid was charged again")
	})

	// The same with a chain of voids: the changed cart is held and voided
	// too. A third cart, made before or after the payment is written over
	// the first void, sends nothing.
	t.Run("a payment written over a void behind another void is the action's latest", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name       string
			madeBefore bool // the third cart made before the first POST lands (unarmed over the void), else after
		}{
			{"third cart made while both voids stood", true},
			{"third cart made after the payment was written over the first void", false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				var third *idem.Intent
				var front2 *holdingFront
				var done2 chan error
				w := overruledWorldWith(t, false, func(w *overruledWorld) {
					target, err := url.Parse(w.srv.URL)
					require.NoError(t, err)
					front2 = &holdingFront{proxy: httputil.NewSingleHostReverseProxy(target), held: make(chan struct{}), release: make(chan struct{})}
					fs2 := httptest.NewServer(front2)
					t.Cleanup(fs2.Close)
					req, err := idem.JSONRequest(http.MethodPost, fs2.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_1"})
					require.NoError(t, err)
					second, err := w.a.Intent(ctx, "checkout", req)
					require.NoError(t, err, "the setup: the action's latest is void, so a changed cart is a new intent")
					front2.hold.Store(true)
					done2 = make(chan error, 1)
					go func() { _, err := w.a.Do(ctx, second); done2 <- err }()
					<-front2.held
					w.truth.Advance(time.Hour)
					loaded, err := w.b.Load(ctx, second.Key())
					require.NoError(t, err)
					_, err = w.b.Reconcile(ctx, loaded)
					require.Equal(t, persist.StateVoid, loaded.State(), "the setup: B voided the second intent too (%v)", err)
					if tc.madeBefore {
						req3, err := idem.JSONRequest(http.MethodPost, w.fs.URL+"/payments", map[string]any{"amount": 1700, "currency": "AZN", "customer": "cus_1"})
						require.NoError(t, err)
						third, err = w.a.Intent(ctx, "checkout", req3)
						require.NoError(t, err, "the setup: the latest is void, so a third cart is a new intent")
					}
				})
				defer func() { close(front2.release); <-done2 }()
				first, err := w.a.Load(ctx, w.in.Key())
				require.NoError(t, err)
				require.Equal(t, persist.StateSucceeded, first.State(), "the setup: the first intent is paid")
				if !tc.madeBefore {
					req3, err := idem.JSONRequest(http.MethodPost, w.fs.URL+"/payments", map[string]any{"amount": 1700, "currency": "AZN", "customer": "cus_1"})
					require.NoError(t, err)
					third, err = w.a.Intent(ctx, "checkout", req3)
					if err != nil {
						t.Logf("Intent of the third cart: %v", err)
						var resolved *idem.ResolvedError
						assert.ErrorAs(t, err, &resolved, "the action is paid")
						return
					}
				}
				_, err = w.a.Do(ctx, third)
				t.Logf("A's Do of the third cart: err %v; charges %d", err, w.srv.Stats().ProviderCharges)
				var resolved *idem.ResolvedError
				assert.ErrorAs(t, err, &resolved, "the action is paid")
				assert.Equal(t, 1, w.srv.Stats().ProviderCharges, "a third cart was charged for an action already paid")
			})
		}
	})

	// A's first cart is held past every bound, and B voids it: true, as
	// nothing is charged. The user's changed cart is paid. The held POST
	// lands and is declined, and the dispute's lookup fails, so the first
	// cart is stored unknown over the void. A later SettleAll proves it
	// void. It kept its place, so the paid cart is still the action's
	// latest, and its re-tap sends nothing.
	t.Run("an unknown outcome written over a true void never moves past a paid cart", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newHeldWorld(t, "cus_declined", false)
		a, srv, fs, disk, first := w.a, w.srv, w.fs, w.disk, w.in

		// The user changes the cart; the latest is void, so it is a new
		// intent, and it is paid.
		req2, err := idem.JSONRequest(http.MethodPost, fs.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		resp, err := a.Send(ctx, "checkout", req2)
		require.NoError(t, err, "the setup: the changed cart is paid")
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, 1, srv.Stats().ProviderCharges)

		// The held first POST lands and is declined; arbitrate's lookup fails.
		w.front.failLookups.Store(1)
		err = w.release()
		t.Logf("A's Do of the held first cart: err %v, state %s", err, first.State())
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the setup: the dispute stands")
		stored, err := disk.Get(ctx, first.Key())
		require.NoError(t, err)
		t.Logf("the first cart stored: %s, seq %d", stored.State, stored.Seq)

		// Later, as ErrOutcomeUnknown asks, the app settles everything.
		w.truth.Advance(time.Hour)
		settled, err := a.SettleAll(ctx)
		t.Logf("SettleAll: %d settled, err %v", len(settled), err)
		stored, err = disk.Get(ctx, first.Key())
		require.NoError(t, err)
		t.Logf("the first cart stored: %s, seq %d", stored.State, stored.Seq)
		require.Equal(t, persist.StateVoid, stored.State, "the setup: the declined cart is settled void (true: nothing charged)")

		// The user taps pay again on the paid cart.
		resp, err = a.Send(ctx, "checkout", req2)
		t.Logf("the re-tap of the paid cart: err %v, resp %v, charges %d", err, resp != nil, srv.Stats().ProviderCharges)
		assert.Equal(t, 1, srv.Stats().ProviderCharges, "the paid cart was charged a second time for one action")
	})
}

// disputeUnsettled runs the dispute of TestResolvedRecord that A cannot
// settle; arm breaks the lookup or the store as A's answer arrives.
func disputeUnsettled(t *testing.T, settle bool, arm func(*holdingFront, *flakyWrites)) {
	ctx := context.Background()
	w := newHeldWorld(t, "cus_1", settle)
	a, srv, in := w.a, w.srv, w.in
	arm(w.front, w.store)
	err := w.release()
	t.Logf("A's call: err %v, state %s", err, in.State())
	require.Equal(t, 1, srv.Stats().ProviderCharges, "the setup: the held POST was charged")
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "A is told unknown: true so far")

	// Later, as ErrOutcomeUnknown asks, the app settles the intent.
	later, err := a.Load(ctx, in.Key())
	require.NoError(t, err)
	_, err = a.Settle(ctx, later)
	t.Logf("A's Settle: err %v, state %s", err, later.State())
	assert.NotEqual(t, persist.StateVoid, later.State(),
		"Settle tells void (a new payment is safe) for an intent the server charged, whose 201 A held")
	assert.Equal(t, persist.StateSucceeded, later.State(), "the lookup finds the payment")
	assert.Equal(t, 1, srv.Stats().ProviderCharges, "Settle asks the lookup; it never sends the intent again")
}

// holdingFront is a reverse proxy in front of the server. While hold is
// set it holds the next POST until release is closed (a request held on
// its way past every bound). While failLookups > 0 it answers that many
// lookups (GET with idempotency_key) with its own 503.
type holdingFront struct {
	proxy       *httputil.ReverseProxy
	hold        atomic.Bool
	held        chan struct{}
	release     chan struct{}
	failLookups atomic.Int32
}

func (f *holdingFront) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && f.hold.CompareAndSwap(true, false) {
		close(f.held)
		<-f.release
	}
	if r.Method == http.MethodGet && r.URL.Query().Has("idempotency_key") && f.failLookups.Add(-1) >= 0 {
		http.Error(rw, "upstream connect error", http.StatusServiceUnavailable)
		return
	}
	f.proxy.ServeHTTP(rw, r)
}

// flakyWrites is a real FileStore whose n-th write from when it is armed
// fails, as a full disk's would, with nothing written.
type flakyWrites struct {
	persist.Store
	armed    atomic.Bool
	writes   atomic.Int32
	failAt   int32
	failAlso int32 // a second write that fails, or 0
}

func (s *flakyWrites) Write(ctx context.Context, r, old *persist.Record) error {
	if !s.armed.Load() {
		return s.Store.Write(ctx, r, old)
	}
	if n := s.writes.Add(1); n == s.failAt || n == s.failAlso {
		return fmt.Errorf("write %s: %w", r.Key, syscall.ENOSPC)
	}
	return s.Store.Write(ctx, r, old)
}

func TestSendAgain(t *testing.T) {
	t.Parallel()
	t.Run("a write whose result is unknown never says nothing was sent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		st := &syncFailsWhen{Store: persist.NewMemory(nil)}
		e.store = st
		hc, down := switchable()
		c := e.newClient(t, idem.WithHTTPClient(hc))
		in, err := c.Intent(ctx, "checkout:again", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		down.Store(true)
		_, err = c.Do(oneAttempt(), in)
		require.ErrorIs(t, err, idem.ErrNotSent, "offline: not sent")
		down.Store(false)
		// The user taps again; the write that takes the intent out of
		// "not sent" lands, but its sync fails.
		var once atomic.Bool
		st.fail = func(_, old *persist.Record) bool {
			return old != nil && old.State == persist.StateNotSent && once.CompareAndSwap(false, true)
		}
		_, err = c.Do(ctx, in)
		require.Error(t, err)
		var se *idem.SaveError
		require.ErrorAs(t, err, &se)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the write that armed it again may have landed")
		assert.NotErrorIs(t, err, idem.ErrNotSent)
		assert.Zero(t, e.srv.Stats().ProviderCharges, "this call sent nothing")
	})
}

// cancelAfterClaim ends a context once a claim (a write with no old
// record) has landed: the tap's screen went away as it was armed.
type cancelAfterClaim struct {
	persist.Store
	cancel func()
}

func (s *cancelAfterClaim) Write(ctx context.Context, rec, old *persist.Record) error {
	err := s.Store.Write(ctx, rec, old)
	if err == nil && old == nil && s.cancel != nil {
		s.cancel()
	}
	return err
}

// anotherSending arms on a the intent "checkout:shared" to pay 100: a's
// tap, its first byte not sent yet. Another Client on e's store, b, then
// resumes the intent, and its request leaves the device and is held. It
// returns a's and b's values of the intent, release, which lets b's
// request on, and where b's call will end.
func anotherSending(t *testing.T, e *env, a *idem.Client) (*idem.Intent, *idem.Intent, func(), <-chan error) {
	t.Helper()
	ctx := context.Background()
	hold := holdPOSTs{base: e.srv.Client().Transport, entered: make(chan struct{}, 1), release: make(chan struct{})}
	b := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: hold}))
	ina, err := a.Intent(ctx, "checkout:shared", e.paymentRequest(t, 100, "cus_1"))
	require.NoError(t, err)
	require.NoError(t, idem.Arm(a, ctx, ina))
	inb, err := b.Intent(ctx, "checkout:shared", e.paymentRequest(t, 100, "cus_1"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := b.Do(ctx, inb); done <- err }()
	<-hold.entered
	return ina, inb, func() { close(hold.release) }, done
}

func TestTakeOver(t *testing.T) {
	t.Parallel()
	t.Run("a Client never takes for unsent an intent another Client took over and sent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		st := &cancelAfterClaim{Store: e.store}
		e.store = st
		// The app's network: down makes every dial fail, so nothing of a
		// request is written.
		var down atomic.Bool
		base := e.srv.Client().Transport.(*http.Transport).Clone()
		base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if down.Load() {
				return nil, errors.New("network is unreachable")
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		app := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: base}))
		in, err := app.Intent(ctx, "checkout:stale", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		// The tap, whose context ends as it is armed: no attempt.
		gone, cancel := context.WithCancel(ctx)
		st.cancel = cancel
		_, _ = app.Do(gone, in)
		st.cancel = nil

		// The daemon, another Client on the store, settles it: charged,
		// the answer lost.
		daemon := e.newClient(t)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
		_, err = daemon.SettleAll(oneAttempt())
		require.NoError(t, err)
		require.Equal(t, 1, e.srv.Stats().ProviderCharges)

		// The user taps again, offline: nothing of this tap is written,
		// but the daemon's send was charged.
		down.Store(true)
		_, err = app.Do(ctx, in)
		assert.NotErrorIs(t, err, idem.ErrNotSent, "told not sent while the daemon's send charged it")
		assert.Equal(t, persist.StatePending, in.State(), "the app's intent reads as the store has it, sent by the daemon, not as the app armed it")
		stored, err := e.store.Get(ctx, in.Key())
		require.NoError(t, err)
		assert.NotEqual(t, persist.StateNotSent, stored.State, "stored not sent while the daemon's send charged it")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "one cart, one charge")
	})
	t.Run("a Client whose not-sent intent another Client armed and sent never ends it not sent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		x := notSentThenCharged(t, func(s persist.Store) persist.Store { return s })

		// B's call sends nothing (its Authorizer fails again), but A's
		// request was charged: B must not say, nor store, "not sent".
		x.authFails.Store(true)
		_, err := x.b.Do(ctx, x.onB)
		assert.NotErrorIs(t, err, idem.ErrNotSent)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		stored, err := x.st.Get(ctx, x.onB.Key())
		require.NoError(t, err)
		assert.NotEqual(t, persist.StateNotSent, stored.State)
	})

	// Path (the simulation's seed 8002373): B's tap ended not sent; A sent
	// the intent again and the server charged it, but the disk filled
	// before A recorded the answer. B then took the intent over: its write
	// landed and reported an error (a failed fsync). B still held its
	// proof that the intent was never sent, so the call's end made it
	// "armed", and the user's changed cart replaced the charged intent and
	// paid again.
	t.Run("a take-over whose write landed but failed never makes another Client's charged intent replaceable", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var onB *landsButFails
		x := notSentThenCharged(t, func(s persist.Store) persist.Store {
			onB = &landsButFails{Store: s}
			return onB
		})

		onB.failing.Store(true)
		_, err := x.b.Do(ctx, x.onB)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		onB.failing.Store(false)

		_, err = x.b.Intent(ctx, "tips", x.e.paymentRequest(t, 200, "cus_1"))
		require.ErrorAs(t, err, new(*idem.UnresolvedError), "the intent was charged: a changed cart never replaces it")
		assert.Equal(t, 1, x.e.srv.Stats().ProviderCharges)
	})

	// One Client armed an intent and has not sent it (its tap's first byte is
	// still to leave, or its one attempt was refused before a byte left); the
	// other Client on the store resumes that intent, as SettleAll at app start
	// does, and its request is on the wire. The first Client's changed cart
	// must not replace it: that would be a second payment for one action.
	t.Run("a changed cart never replaces an intent another Client is sending", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		a := e.newClient(t)
		ina, inb, release, done := anotherSending(t, e, a)
		require.Equal(t, ina.Key(), inb.Key())

		changed, err := a.Intent(ctx, "checkout:shared", e.paymentRequest(t, 200, "cus_1"))
		if err == nil {
			_, err = a.Do(ctx, changed)
		}
		release()
		require.NoError(t, <-done)
		assert.ErrorAs(t, err, new(*idem.UnresolvedError), "the armed intent may be on the wire: a's changed cart is refused")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "one payment for one action")
	})

	// A Client whose own attempt of the intent it armed never left the device
	// does not record the intent not sent when another Client on the store took
	// it over meanwhile: that Client's request may be on the wire, and a "not
	// sent" intent is one a changed cart replaces.
	t.Run("an intent another Client took over is never recorded not sent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		refusing := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}}
		a := e.newClient(t,
			idem.WithHTTPClient(&http.Client{Transport: refuseFirstPOST{refusing: refusing, base: e.srv.Client().Transport, posts: new(atomic.Int32)}}),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		ina, _, release, done := anotherSending(t, e, a)

		_, err := a.Do(ctx, ina) // a's own attempt never leaves the device
		require.Error(t, err)
		assert.NotErrorAs(t, err, new(*idem.NotSentError), "b may have sent it: its outcome is unknown to a")
		changed, err := a.Intent(ctx, "checkout:shared", e.paymentRequest(t, 200, "cus_1"))
		if err == nil {
			_, err = a.Do(ctx, changed)
		}
		release()
		require.NoError(t, <-done)
		assert.ErrorAs(t, err, new(*idem.UnresolvedError), "a's changed cart is refused")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "one payment for one action")
	})

	// Two Clients on one store, one after the other made, each counting its
	// versions from 1: the second takes over the first's intent whose answer was
	// lost, and the first then reads the second's outcome; one charge.
	t.Run("two Clients on one store never share a version", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		store := dirStore(t, filepath.Join(t.TempDir(), "s"))
		t.Cleanup(func() { store.Close() })
		mk := func() *idem.Client {
			c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: echoLookupServer, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
			require.NoError(t, err)
			return c
		}
		a, b := mk(), mk()
		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
		_, err = a.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Do(ctx, loaded) // takes over, resends, gets the replay
		require.NoError(t, err)
		resp, err := a.Do(ctx, in)
		require.NoError(t, err)
		assert.True(t, resp.FromStore || resp.Replayed)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})
}

// chargedAfterNotSent is the world notSentThenCharged leaves.
type chargedAfterNotSent struct {
	e         *env
	st        *outcomeFailStore
	authFails *atomic.Bool
	b         *idem.Client
	onB       *idem.Intent // B's view of the intent A's request charged
}

// notSentThenCharged: two Clients on one store, A and B, whose
// Authorizer fails while authFails is set; B's store is wrapB's. B's tap
// ends "not sent" (its Authorizer failed). The user taps again; both
// parts of the app hold the intent. A sends it and the server charges;
// the disk fills before A records the answer.
func notSentThenCharged(t *testing.T, wrapB func(persist.Store) persist.Store) chargedAfterNotSent {
	t.Helper()
	ctx := context.Background()
	x := chargedAfterNotSent{e: newEnv(t), authFails: new(atomic.Bool)}
	x.st = &outcomeFailStore{Store: x.e.store}
	x.st.fail.Store(true)
	auth := func(c *idem.Config) {
		c.Authorizer = func(context.Context, string) (string, error) {
			if x.authFails.Load() {
				return "", errors.New("token refresh failed")
			}
			return "", nil
		}
	}
	a := x.e.newClient(t, idem.WithStore(x.st), auth)
	x.b = x.e.newClient(t, idem.WithStore(wrapB(x.st)), auth)
	req := x.e.paymentRequest(t, 100, "cus_1")

	first, err := x.b.Intent(ctx, "tips", req)
	require.NoError(t, err)
	x.authFails.Store(true)
	_, err = x.b.Do(ctx, first)
	require.ErrorIs(t, err, idem.ErrNotSent)
	x.authFails.Store(false)

	onA, err := a.Intent(ctx, "tips", req)
	require.NoError(t, err)
	x.onB, err = x.b.Intent(ctx, "tips", req)
	require.NoError(t, err)
	require.Equal(t, onA.Key(), x.onB.Key())
	_, err = a.Do(ctx, onA)
	require.Error(t, err)
	require.Equal(t, 1, x.e.srv.Stats().ProviderCharges)
	return x
}

// landsButFails is a store whose writes land and report an error while
// failing is set: the record reached the disk, and its fsync failed.
type landsButFails struct {
	persist.Store
	failing atomic.Bool
}

func (s *landsButFails) Write(ctx context.Context, rec, old *persist.Record) error {
	if err := s.Store.Write(ctx, rec, old); err != nil {
		return err
	}
	if s.failing.Load() {
		return errors.New("fsync: input/output error")
	}
	return nil
}

// outcomeFailStore fails the writes of resolved records while fail is set:
// the disk fills up right after the server's answer.
type outcomeFailStore struct {
	persist.Store
	fail atomic.Bool
}

func (s *outcomeFailStore) Write(ctx context.Context, rec, old *persist.Record) error {
	if s.fail.Load() && rec.State.Resolved() {
		return errors.New("no space left on device")
	}
	return s.Store.Write(ctx, rec, old)
}

func testCut(t *testing.T, cut faultproxy.Cut, chunk bool) {
	clk := clock.NewManual(relEpoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	var handler http.Handler = h
	if chunk {
		handler = chunked{h}
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	proxy, err := faultproxy.New(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, proxy.Close()) })
	proxy.Script(cut)

	// A fresh connection per attempt: the cut meets exactly the first
	// attempt, and net/http cannot hide it by retrying a reused connection.
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	var log attemptLog
	c, err := idem.NewWith(
		idem.WithHTTPClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}),
		idem.WithStore(persist.NewMemory(nil)),
		idem.WithClock(clk),
		idem.WithAttemptHook(log.hook),
	)
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, proxy.URL()+"/payments", map[string]any{
		"amount": 1500, "currency": "AZN", "customer": "cus_1",
		// Long enough that a cut at 300 bytes falls in the body.
		"description": strings.Repeat("a long description ", 20),
	})
	require.NoError(t, err)
	ctx := context.Background()
	in, err := c.Intent(ctx, "checkout:cut", req)
	require.NoError(t, err)

	resp, err := c.Do(ctx, in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, persist.StateSucceeded, in.State())
	require.Equal(t, faultproxy.Stats{Conns: 2, Cut: 1}, proxy.Stats(), "one cut connection, one whole")

	attempts := log.all()
	require.Len(t, attempts, 2)
	first := attempts[0]
	assert.Error(t, first.Err, "the cut attempt is an error")
	assert.Zero(t, first.StatusCode, "the cut attempt has no status, whatever headers arrived")
	assert.True(t, first.Retry, "and it is retried")
	assert.Equal(t, http.StatusCreated, attempts[1].StatusCode)
	assert.Equal(t, in.Key(), attempts[1].Key, "with the same key")

	stats := h.Stats()
	assert.Equal(t, 1, stats.Payments)
	assert.Equal(t, 1, stats.ProviderCharges)
	assert.Equal(t, 1, stats.Executions)
	// A cut before the whole request was read did no work: the retry did it
	// fresh. A cut in the answer came after the work: the retry is a replay.
	assert.Equal(t, cut.Point != faultproxy.InRequest, resp.Replayed)

	// What the client reports is the payment the server stored for the key.
	lookup, err := srv.Client().Get(lookupOf(srv.URL+"/payments", in.Key()))
	require.NoError(t, err)
	defer lookup.Body.Close()
	body, err := io.ReadAll(lookup.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, lookup.StatusCode)
	assert.JSONEq(t, string(body), string(resp.Body))
}

// TestServerTakeOver: a worker charged the provider and died; another
// request takes its record over.
func TestServerTakeOver(t *testing.T) {
	t.Parallel()
	// The take-over fails (a 500) before recording anything. The record
	// keeps its stable id, so the next request asks the provider again
	// instead of charging under a new id.
	t.Run("a take-over that fails keeps the provider's charge", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk, Lease: 5 * time.Second})
		t.Cleanup(srv.Close)
		tr := &http.Transport{DisableKeepAlives: true} // no transport-level retry
		t.Cleanup(tr.CloseIdleConnections)
		hc := &http.Client{Transport: tr}
		const key = "takeover-then-error"
		post := func() (int, error) {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			resp, err := hc.Do(req)
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, nil
		}

		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: key}))
		_, err := post()
		require.Error(t, err, "the worker died after charging")
		require.Equal(t, 1, srv.Stats().ProviderCharges)

		clk.Advance(6 * time.Second) // the dead worker's lease is over
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError, Key: key}))
		status, err := post()
		require.NoError(t, err)
		require.Equal(t, http.StatusInternalServerError, status, "the take-over failed")

		status, err = post()
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		stats := srv.Stats()
		assert.Equal(t, 1, stats.Payments)
		assert.Equal(t, 1, stats.ProviderCharges, "one payment, charged twice at the provider")
	})
}
