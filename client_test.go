package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

var epoch = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

// env is one fake server and one client that share a manual clock: a client
// that waits two seconds makes two seconds pass for the server's leases too.
type env struct {
	srv    *fakeserver.Server
	clock  *clock.Manual
	store  persist.Store
	client *idem.Client
}

func newEnv(t testing.TB, opts ...idem.Option) *env {
	t.Helper()
	return newEnvAt(t, epoch, opts...)
}

// newEnvAt is newEnv with the manual clock set to start.
func newEnvAt(t testing.TB, start time.Time, opts ...idem.Option) *env {
	t.Helper()
	clk := clock.NewManual(start)
	srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk})
	e := &env{srv: srv, clock: clk, store: persist.NewMemory(nil)}
	e.client = e.newClient(t, opts...)
	return e
}

// newClient is a fresh Client on the env's store and clock, as after a
// restart of the app.
func (e *env) newClient(t testing.TB, opts ...idem.Option) *idem.Client {
	t.Helper()
	base := []idem.Option{
		idem.WithHTTPClient(e.srv.Client()),
		idem.WithStore(e.store),
		idem.WithClock(e.clock),
	}
	c, err := idem.New(append(base, opts...)...)
	require.NoError(t, err)
	return c
}

type payment struct {
	ID       string `json:"id"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
	Status   string `json:"status"`
}

func (e *env) paymentRequest(t testing.TB, amount int, customer string) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, e.srv.URL+"/payments", map[string]any{
		"amount": amount, "currency": "AZN", "customer": customer, "description": "cart",
	})
	require.NoError(t, err)
	return req
}

func (e *env) newIntent(t testing.TB, name string, amount int) *idem.Intent {
	t.Helper()
	in, err := e.client.NewIntent(context.Background(), name, e.paymentRequest(t, amount, "cus_1"))
	require.NoError(t, err)
	return in
}

func (e *env) fault(t testing.TB, f fakeserver.Fault) {
	t.Helper()
	require.NoError(t, e.srv.InjectFault(f))
}

func decodePayment(t testing.TB, body []byte) payment {
	t.Helper()
	var p payment
	require.NoError(t, json.Unmarshal(body, &p), "body %s", body)
	return p
}

func TestDoPaysOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:1", 1500)
	assert.Equal(t, idem.StateNew, in.State())

	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.False(t, resp.Replayed)
	assert.Equal(t, 1, resp.Attempts)
	p := decodePayment(t, resp.Body)
	assert.Equal(t, 1500, p.Amount)
	assert.Equal(t, idem.StateSucceeded, in.State())

	stats := e.srv.Stats()
	assert.Equal(t, 1, stats.Payments)
	assert.Equal(t, 1, stats.ProviderCharges)
	assert.Equal(t, 1, stats.Requests)
}

func TestLostResponseIsRetriedAndPaysOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:lost", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})

	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.True(t, resp.Replayed, "the second attempt is answered from the server's record")
	assert.Equal(t, 2, resp.Attempts)

	stats := e.srv.Stats()
	assert.Equal(t, 1, stats.Payments)
	assert.Equal(t, 1, stats.ProviderCharges)
	assert.Equal(t, 1, stats.Executions)

	// The body is the original payment's, as the lookup by key shows it.
	lookup := e.lookup(t, in.Key())
	assert.Equal(t, lookup.ID, decodePayment(t, resp.Body).ID)
}

func (e *env) lookup(t testing.TB, key string) payment {
	t.Helper()
	resp, err := e.srv.Client().Get(e.srv.URL + "/payments?idempotency_key=" + url.QueryEscape(key))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var p payment
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	return p
}

func TestEveryAttemptSendsTheSameBytes(t *testing.T) {
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
}

func TestDoubleTapSendsOneRequestAtATime(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 50} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			clk := clock.NewManual(epoch)
			// The payment takes a while, so that every tap lands while the
			// first is on the wire.
			srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk, ProcessingDelay: 20 * time.Millisecond})
			c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk))
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
}

func TestRestartResumesWithTheSameKey(t *testing.T) {
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
	assert.Equal(t, idem.StatePending, in.State())
	assert.Equal(t, "pending", in.State().String())
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
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{InitialInterval: 100 * time.Millisecond, NoJitter: true}))
	in := e.newIntent(t, "checkout:409", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusConflict, RetryAfter: "3", Count: 2})

	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, 3, resp.Attempts)
	assert.Equal(t, []time.Duration{3 * time.Second, 3 * time.Second}, e.clock.Sleeps(), "never sooner than the server asked")
}

func TestInProgressThenTakeoverAfterCrashedWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:crash", 1500)
	// The worker dies after inserting IN_PROGRESS: the next attempts see 409
	// with Retry-After until the lease runs out, then take over and pay.
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert, Key: in.Key()})
	var seen []int
	c := e.newClient(t, idem.WithAttemptHook(func(a idem.Attempt) { seen = append(seen, a.StatusCode) }))

	resp, err := c.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Contains(t, seen, http.StatusConflict)
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	var waited time.Duration
	for _, s := range e.clock.Sleeps() {
		waited += s
	}
	assert.GreaterOrEqual(t, waited, 30*time.Second, "the default lease had to run out")
}

func TestCrashAfterProviderStillChargesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:provider", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: in.Key()})
	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	stats := e.srv.Stats()
	assert.Equal(t, 1, stats.ProviderCharges)
	assert.Equal(t, 1, stats.Payments)
}

func TestServerErrorIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:500", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultError, Key: in.Key()})
	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, 2, resp.Attempts)
	assert.False(t, resp.Replayed, "a 500 is never stored: the retry does the work")
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
}

func TestConnectionResetIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:reset", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, 2, resp.Attempts)
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
}

func TestDeclineIsFinalAndStored(t *testing.T) {
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
	assert.Equal(t, idem.StateFailed, in.State())
	assert.Equal(t, 0, e.srv.Stats().ProviderCharges)

	again, err := e.client.Do(context.Background(), in)
	require.ErrorAs(t, err, &apiErr)
	assert.True(t, again.FromStore)
	assert.Equal(t, 1, e.srv.Stats().Requests)
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

func TestKeyReusedIsSurfacedWithOneRequest(t *testing.T) {
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
	require.NoError(t, e.store.Save(context.Background(), rec))
	before := e.srv.Stats().Requests
	// The next run of the app finds it in the store.
	in, err = e.newClient(t).Load(context.Background(), in.Key())
	require.NoError(t, err)

	resp, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	var apiErr *idem.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.Equal(t, idem.StateRejected, in.State())
	assert.Equal(t, before+1, e.srv.Stats().Requests, "one request on the wire")
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
}

func TestKeyRejectedIsNotRetried(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk, KeyFormat: fakeserver.KeyFormatUUID})
	store := persist.NewMemory(nil)
	c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithStore(store), idem.WithClock(clk))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	// An older release wrote a key this server does not accept.
	rec, err := store.Get(context.Background(), in.Key())
	require.NoError(t, err)
	rec.Key, rec.KeyHeader = "not-a-uuid", ""
	require.NoError(t, store.Save(context.Background(), rec))
	old, err := c.Load(context.Background(), "not-a-uuid")
	require.NoError(t, err)

	_, err = c.Do(context.Background(), old)
	require.ErrorIs(t, err, idem.ErrKeyRejected)
	assert.NotErrorIs(t, err, idem.ErrKeyReused)
	assert.Equal(t, idem.StateRejected, old.State())
	assert.Equal(t, 1, srv.Stats().Requests)
}

// The budget compares the injected clock's times with the context's
// deadline, which is on the real clock. Whatever the manual clock reads,
// years before or after today, a context with 10 s left refuses a 50 s
// Retry-After at once and honours a 3 s one.
func TestContextDeadlineIsOnTheInjectedClocksTimeline(t *testing.T) {
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
			assert.ErrorIs(t, err, idem.ErrRetriesExhausted)
			assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.Empty(t, e.clock.Sleeps(), "gave up without waiting")
			assert.Equal(t, idem.StatePending, in.State())
		})
		t.Run(name+"/Retry-After within the deadline is honoured", func(t *testing.T) {
			t.Parallel()
			e := newEnvAt(t, start, idem.WithRetryPolicy(idem.RetryPolicy{NoJitter: true}))
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
}

func TestRetryAfterAboveTheCapFailsFast(t *testing.T) {
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
}

func TestMaxAttemptsEndsTheCall(t *testing.T) {
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

func TestCancelDuringAWaitReturnsTheContextError(t *testing.T) {
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
}

func TestExpiredIntentSendsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:old", 1500)
	e.clock.Advance(idem.DefaultRetention - idem.DefaultSafetyMargin)

	_, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrIntentExpired)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Equal(t, idem.StateExpired, in.State())
	assert.Equal(t, 0, e.srv.Stats().Requests)

	// Reconcile settles it: the server never saw the key, and the intent
	// is old, so nothing happened.
	lookup := e.srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	_, err = e.client.Reconcile(context.Background(), in, lookup)
	require.NoError(t, err)
	assert.Equal(t, idem.StateVoid, in.State())
	assert.Equal(t, 0, e.srv.Stats().ProviderCharges)
}

func TestReconcileFindsAPaymentWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	in := e.newIntent(t, "checkout:reconcile", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	lookup := e.srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	resp, err := e.client.Reconcile(context.Background(), in, lookup)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, idem.StateSucceeded, in.State())
	assert.Equal(t, 1500, decodePayment(t, resp.Body).Amount)
}

func TestReconcileDoesNotTrustAnEarlyNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	in := e.newIntent(t, "checkout:early", 1500)
	// The connection breaks before the server reads the request: the
	// server has no record, yet from the client's side the attempt may
	// still be on its way.
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
	_, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	lookup := e.srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	_, err = e.client.Reconcile(context.Background(), in, lookup)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a 404 right after the attempt is not trusted")
	assert.Equal(t, idem.StatePending, in.State())

	e.clock.Advance(idem.DefaultReconcileDelay)
	_, err = e.client.Reconcile(context.Background(), in, lookup)
	require.NoError(t, err)
	assert.Equal(t, idem.StateVoid, in.State())
	assert.Equal(t, 0, e.srv.Stats().ProviderCharges)
}

func TestReconcileKeepsADeadWorkersKeyUnsettled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	in := e.newIntent(t, "checkout:dead", 1500)
	// The worker dies after the provider charged: no payment row yet.
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: in.Key()})
	_, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	e.clock.Advance(idem.DefaultReconcileDelay)

	lookup := e.srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	_, err = e.client.Reconcile(context.Background(), in, lookup)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "never void while the server holds the key")
	assert.Equal(t, idem.StatePending, in.State())

	// Resuming settles it: the server asks the provider and records the
	// charge that was made.
	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
}

func TestIntentForAnAction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("same request reuses the intent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:a", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		b, err := e.client.Intent(ctx, "checkout:a", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		assert.Equal(t, a.Key(), b.Key())
	})

	t.Run("changed cart before sending replaces the unsent intent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:b", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		b, err := e.client.Intent(ctx, "checkout:b", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err)
		assert.NotEqual(t, a.Key(), b.Key())
		_, err = e.store.Get(ctx, a.Key())
		assert.ErrorIs(t, err, persist.ErrNotFound, "the unsent intent is dropped")
	})

	t.Run("changed cart after a success is a new intent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:c", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, a)
		require.NoError(t, err)
		b, err := e.client.Intent(ctx, "checkout:c", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err)
		assert.NotEqual(t, a.Key(), b.Key())
	})

	t.Run("changed cart with an unknown outcome is refused", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		a, err := e.client.Intent(ctx, "checkout:d", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: a.Key()})
		_, err = e.client.Do(ctx, a)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		_, err = e.client.Intent(ctx, "checkout:d", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorIs(t, err, idem.ErrUnresolved)
		var unresolved *idem.UnresolvedError
		require.ErrorAs(t, err, &unresolved)
		assert.Equal(t, a.Key(), unresolved.Previous.Key())
		_, err = e.client.NewIntent(ctx, "checkout:d", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorIs(t, err, idem.ErrUnresolved, "NewIntent refuses too")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	t.Run("after a restart a new intent may have been sent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		_, err := e.client.Intent(ctx, "checkout:e", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		restarted := e.newClient(t)
		_, err = restarted.Intent(ctx, "checkout:e", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorIs(t, err, idem.ErrUnresolved)
	})

	t.Run("paying again after a decline takes NewIntent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:f", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, a)
		require.Error(t, err)
		same, err := e.client.Intent(ctx, "checkout:f", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		assert.Equal(t, a.Key(), same.Key(), "Intent shows the decline again")
		b, err := e.client.NewIntent(ctx, "checkout:f", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		assert.NotEqual(t, a.Key(), b.Key())
	})

	t.Run("intents are only for POST and PATCH", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodHead} {
			_, err := e.client.NewIntent(ctx, "", idem.Request{Method: m, URL: e.srv.URL + "/payments"})
			assert.ErrorIs(t, err, idem.ErrNotIntentMethod, m)
		}
	})
}

// failingStore refuses every Save, as a full disk would.
type failingStore struct{ persist.Store }

var errDiskFull = errors.New("no space left on device")

func (failingStore) Save(context.Context, *persist.Record) error { return errDiskFull }

func TestNothingIsSentWhenTheIntentCannotBeSaved(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newClient(t, idem.WithStore(failingStore{persist.NewMemory(nil)}))
	_, err := c.Intent(context.Background(), "checkout:full", e.paymentRequest(t, 100, "cus_1"))
	var saveErr *idem.SaveError
	require.ErrorAs(t, err, &saveErr)
	assert.ErrorIs(t, err, errDiskFull)
	assert.Equal(t, 0, e.srv.Stats().Requests)
}

func TestQuotedKeyIsTheSameKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithQuotedKey())
	in := e.newIntent(t, "checkout:quoted", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.True(t, resp.Replayed, "the quoted key found the bare key's record")
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	assert.NotEmpty(t, e.lookup(t, in.Key()).ID, "the server filed the payment under the bare key")
}

func TestRestartOnTheFileStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk})
	dir := filepath.Join(t.TempDir(), "state") // OpenDir makes it 0700
	open := func(opts ...idem.Option) (*idem.Client, *persist.FileStore) {
		store, err := persist.OpenDir(dir, nil)
		require.NoError(t, err)
		c, err := idem.New(append([]idem.Option{idem.WithStore(store), idem.WithHTTPClient(srv.Client()), idem.WithClock(clk)}, opts...)...)
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
	assert.Equal(t, idem.StateSucceeded, same.State())
}

func TestReconcileUnavailableIsUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	in := e.newIntent(t, "checkout:busy", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
	_, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	e.clock.Advance(idem.DefaultReconcileDelay)

	// A proxy in front of the server cannot answer now: not settled.
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, RetryAfter: "1"})
	lookup := e.srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	_, err = e.client.Reconcile(context.Background(), in, lookup)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	var apiErr *idem.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusServiceUnavailable, apiErr.StatusCode)
	assert.Equal(t, idem.StatePending, in.State())
}

func TestAStaleIntentValueReadsTheStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:stale", 1500)
	stale, err := e.client.Load(context.Background(), in.Key())
	require.NoError(t, err)
	_, err = e.client.Do(context.Background(), in)
	require.NoError(t, err)

	// stale's copy of the record still says "new", but it was sent: it
	// reads pending; the store says succeeded, and wins.
	assert.Equal(t, idem.StatePending, stale.State())
	resp, err := e.client.Do(context.Background(), stale)
	require.NoError(t, err)
	assert.True(t, resp.FromStore)
	assert.Equal(t, idem.StateSucceeded, stale.State())
	assert.Equal(t, 1, e.srv.Stats().Requests)
}

func TestUnreadableRecordStopsOnlyItsOwnAction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	dir := filepath.Join(t.TempDir(), "state")
	store, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	c := e.newClient(t, idem.WithStore(store))
	good, err := c.Intent(ctx, "checkout:good", e.paymentRequest(t, 100, "cus_1"))
	require.NoError(t, err)
	bad, err := c.Intent(ctx, "checkout:bad", e.paymentRequest(t, 200, "cus_1"))
	require.NoError(t, err)

	// Damage the second intent's file on disk.
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	damaged := 0
	for _, de := range entries {
		if de.IsDir() || !strings.HasSuffix(de.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, de.Name())
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		if strings.Contains(string(data), bad.Key()) {
			require.NoError(t, os.WriteFile(path, data[:len(data)/2], 0o600))
			damaged++
		}
	}
	require.Equal(t, 1, damaged)
	require.NoError(t, store.Close())
	store, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	c = e.newClient(t, idem.WithStore(store))

	// The readable intent still resumes; a new intent for the damaged
	// record's action is refused, naming the record, because it could be
	// that action's unresolved intent; other actions go on.
	pending, err := c.Unresolved(ctx)
	var corrupt *persist.CorruptError
	require.ErrorAs(t, err, &corrupt)
	require.Len(t, pending, 1)
	assert.Equal(t, good.Key(), pending[0].Key())
	_, err = c.Do(ctx, pending[0])
	require.NoError(t, err)

	_, err = c.Intent(ctx, "checkout:bad", e.paymentRequest(t, 300, "cus_1"))
	require.ErrorAs(t, err, &corrupt)
	assert.Equal(t, bad.Key(), corrupt.Key)
	_, err = c.Intent(ctx, "checkout:other", e.paymentRequest(t, 300, "cus_1"))
	require.NoError(t, err, "a damaged file blocks only the action it may belong to")
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
}

// countingHandler counts slog records.
type countingHandler struct {
	mu *sync.Mutex
	n  *int
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(context.Context, slog.Record) error {
	h.mu.Lock()
	*h.n++
	h.mu.Unlock()
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

func TestLoggerGetsTheRecords(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	n := 0
	e := newEnv(t, idem.WithLogger(slog.New(countingHandler{&mu, &n})))
	in := e.newIntent(t, "checkout:log", 100)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable})
	_, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	// go-retryablehttp's records and idem's own go to the same logger.
	assert.GreaterOrEqual(t, n, 3)
}

// gateStore holds the first Get after arm until release, so a test can
// start a second call while the first is inside the store.
type gateStore struct {
	persist.Store
	armed   chan struct{} // closed by the held Get once it is waiting
	release chan struct{}
	once    sync.Once
	on      bool
	mu      sync.Mutex
}

func (g *gateStore) Get(ctx context.Context, key string) (*persist.Record, error) {
	g.mu.Lock()
	hold := g.on
	g.on = false
	g.mu.Unlock()
	if hold {
		g.once.Do(func() { close(g.armed) })
		<-g.release
	}
	return g.Store.Get(ctx, key)
}

func TestReconcileHoldsTheIntentAgainstDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	gate := &gateStore{Store: e.store, armed: make(chan struct{}), release: make(chan struct{})}
	c := e.newClient(t, idem.WithStore(gate), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	in, err := c.NewIntent(ctx, "checkout:hold", e.paymentRequest(t, 1500, "cus_1"))
	require.NoError(t, err)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
	_, err = c.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	e.clock.Advance(idem.DefaultReconcileDelay)

	gate.mu.Lock()
	gate.on = true
	gate.mu.Unlock()
	lookup := e.srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	reconciled := make(chan error, 1)
	go func() {
		_, err := c.Reconcile(ctx, in, lookup)
		reconciled <- err
	}()
	<-gate.armed // Reconcile is inside the store, holding the intent
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, in)
		done <- err
	}()
	// The Do cannot finish while Reconcile holds the key; Forget is refused.
	require.ErrorIs(t, c.Forget(ctx, in), idem.ErrInFlight)
	close(gate.release)
	require.NoError(t, <-reconciled)
	assert.Equal(t, idem.StateVoid, in.State())

	// Then the Do runs on its own and finds the intent settled: it sends
	// nothing, so the void stays true.
	require.Error(t, <-done)
	assert.Equal(t, idem.StateVoid, in.State())
	assert.Equal(t, 0, e.srv.Stats().ProviderCharges)
	assert.Equal(t, 0, e.srv.Stats().Executions)
}

func TestAFinalAnswerThatArrivesAsTheCallIsCancelledIsKept(t *testing.T) {
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
	assert.Equal(t, idem.StateSucceeded, in.State(), "the answer in hand is recorded, not thrown away")
	rec, err := e.store.Get(context.Background(), in.Key())
	require.NoError(t, err)
	assert.Equal(t, persist.StateSucceeded, rec.State)
}
