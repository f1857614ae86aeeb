package idem_test

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// gatedServer is the real fake server behind a gate that holds every
// POST /payments until released, and writes down each one's key as it
// arrives: a way to act while an attempt is on the wire, without sleeping.
type gatedServer struct {
	h       *fakeserver.Handler
	url     string
	client  *http.Client
	clock   *clock.Manual
	arrived chan string // the Idempotency-Key of each POST /payments
	release chan struct{}
	once    sync.Once
}

func newGatedServer(t *testing.T) *gatedServer {
	t.Helper()
	clk := clock.NewManual(epoch)
	g := &gatedServer{
		h:       fakeserver.NewHandler(&fakeserver.Options{Clock: clk}),
		clock:   clk,
		arrived: make(chan string, 16),
		release: make(chan struct{}),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/payments" {
			g.arrived <- r.Header.Get("Idempotency-Key")
			<-g.release
		}
		g.h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(g.open) // runs before srv.Close: no handler stays blocked
	g.url, g.client = srv.URL, srv.Client()
	return g
}

func (g *gatedServer) open() { g.once.Do(func() { close(g.release) }) }

func (g *gatedServer) newClient(t *testing.T, opts ...idem.Option) *idem.Client {
	t.Helper()
	c, err := idem.New(append([]idem.Option{idem.WithHTTPClient(g.client), idem.WithClock(g.clock)}, opts...)...)
	require.NoError(t, err)
	return c
}

func (g *gatedServer) payment(t *testing.T, amount int) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, g.url+"/payments", map[string]any{"amount": amount, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	return req
}

// The record counts the attempts of every call, not only the last one's.
func TestReviewAttemptsAccumulateAcrossCalls(t *testing.T) {
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
}

// Request returns a copy: changing it cannot change what the intent sends.
func TestReviewRequestIsACopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:copy", 100)
	want := e.paymentRequest(t, 100, "cus_1")

	got := in.Request()
	got.Body[0] = 'X'
	got.Header.Set("Content-Type", "text/plain")
	assert.Equal(t, want.Body, in.Request().Body)
	assert.Equal(t, "application/json", in.Request().Header.Get("Content-Type"))
	resp, err := e.client.Do(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
}

// While the first attempt is on the wire the intent counts as sent: a
// changed cart is refused, not allowed to replace it and pay twice.
func TestReviewAnIntentOnTheWireIsNotReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newGatedServer(t)
	c := g.newClient(t)
	a, err := c.Intent(ctx, "checkout:wire", g.payment(t, 100))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, a)
		done <- err
	}()
	require.Equal(t, a.Key(), <-g.arrived)

	_, err = c.Intent(ctx, "checkout:wire", g.payment(t, 200))
	require.ErrorIs(t, err, idem.ErrUnresolved)
	// Neither the Reconcile nor the Forget of a busy intent may run.
	_, err = c.Reconcile(ctx, a, g.url+"/payments?idempotency_key="+url.QueryEscape(a.Key()))
	require.ErrorIs(t, err, idem.ErrInFlight)
	require.ErrorIs(t, c.Forget(ctx, a), idem.ErrInFlight)

	g.open()
	require.NoError(t, <-done)
	assert.Equal(t, 1, g.h.Stats().ProviderCharges)
	assert.Equal(t, idem.StateSucceeded, a.State())
}

// WithQuotedKey puts the key on the wire as an sf-string.
func TestReviewQuotedKeyIsQuotedOnTheWire(t *testing.T) {
	t.Parallel()
	g := newGatedServer(t)
	g.open()
	for _, quoted := range []bool{false, true} {
		var opts []idem.Option
		if quoted {
			opts = append(opts, idem.WithQuotedKey())
		}
		c := g.newClient(t, opts...)
		in, err := c.NewIntent(context.Background(), "", g.payment(t, 100))
		require.NoError(t, err)
		_, err = c.Do(context.Background(), in)
		require.NoError(t, err)
		want := in.Key()
		if quoted {
			want = `"` + in.Key() + `"`
		}
		assert.Equal(t, want, <-g.arrived)
	}
}

// A certificate the client does not trust is not retried: no retry fixes it.
func TestReviewCertificateErrorIsNotRetried(t *testing.T) {
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
	c, err := idem.New(idem.WithHTTPClient(&http.Client{Transport: tr}), idem.WithClock(clk), idem.WithAttemptHook(attempts.hook))
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
}

// The error of a call that gave up carries the last answer's body.
func TestReviewRetryErrorKeepsTheLastBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2}))
	in := e.newIntent(t, "checkout:body", 100)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, Count: 2})
	_, err := e.client.Do(context.Background(), in)
	var retryErr *idem.RetryError
	require.ErrorAs(t, err, &retryErr)
	require.NotNil(t, retryErr.LastResponse)
	assert.Contains(t, string(retryErr.LastResponse.Body), "the status fault answered this request")
}

// A Retry-After that would land the next attempt past the intent's expiry
// ends the call there: the key is never sent after it.
func TestReviewNoAttemptAfterExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:late", 100)
	e.clock.Advance(idem.DefaultRetention - idem.DefaultSafetyMargin - 5*time.Second)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable, RetryAfter: "10"})

	_, err := e.client.Do(context.Background(), in)
	var retryErr *idem.RetryError
	require.ErrorAs(t, err, &retryErr)
	assert.Equal(t, idem.StopExpired, retryErr.Reason)
	assert.ErrorIs(t, err, idem.ErrIntentExpired)
	assert.Equal(t, 1, e.srv.Stats().Requests)
	assert.Empty(t, e.clock.Sleeps())
	assert.Equal(t, idem.StateExpired, in.State())
	rec, err := e.store.Get(context.Background(), in.Key())
	require.NoError(t, err)
	assert.Equal(t, persist.StateExpired, rec.State)
}

func TestReviewRetentionMustLeaveTimeToSend(t *testing.T) {
	t.Parallel()
	_, err := idem.New(idem.WithRetention(time.Hour, time.Hour))
	require.Error(t, err)
	_, err = idem.New(idem.WithRetention(2*time.Hour, time.Hour))
	require.NoError(t, err)
}

func TestReviewUnresolvedLeavesOutResolvedIntents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	done := e.newIntent(t, "checkout:done", 100)
	_, err := e.client.Do(ctx, done)
	require.NoError(t, err)
	open := e.newIntent(t, "checkout:open", 200)
	pending, err := e.client.Unresolved(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	assert.Equal(t, open.Key(), pending[0].Key())
}

// A payment found by Reconcile is the intent's stored answer from then on,
// and the caller's copy is its own.
func TestReviewReconciledAnswerIsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	in := e.newIntent(t, "checkout:found", 100)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := e.client.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	resp, err := e.client.Reconcile(ctx, in, e.srv.URL+"/payments?idempotency_key="+url.QueryEscape(in.Key()))
	require.NoError(t, err)
	want := bytes.Clone(resp.Body)
	resp.Body[0] = 'X'
	resp.Header.Set("Content-Type", "text/plain")

	require.NotNil(t, in.Response())
	assert.Equal(t, want, in.Response().Body)
	again, err := e.client.Do(ctx, in)
	require.NoError(t, err)
	assert.True(t, again.FromStore)
	assert.Equal(t, want, again.Body)
	assert.Equal(t, "application/json", again.Header.Get("Content-Type"))
}

// cancelOnFinal cancels the call's context once the server's final answer
// is in hand: the outcome must still be saved.
func TestReviewOutcomeIsSavedAfterACancel(t *testing.T) {
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
}

func TestReviewAttemptsAreSavedAfterACancel(t *testing.T) {
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

func TestReviewReconcileSavesAfterACancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	in := e.newIntent(t, "checkout:reconcile-cancel", 100)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := e.client.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	c := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: cancelAfterAnswer{e.srv.Client().Transport, cancel}}))
	_, err = c.Reconcile(ctx, in, e.srv.URL+"/payments?idempotency_key="+url.QueryEscape(in.Key()))
	require.NoError(t, err)
	rec, err := e.store.Get(context.Background(), in.Key())
	require.NoError(t, err)
	assert.Equal(t, persist.StateSucceeded, rec.State)
}

func TestReviewDoWithANilIntent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	assert.NotPanics(t, func() {
		_, err := e.client.Do(context.Background(), nil)
		assert.Error(t, err)
	})
}

// A call that put nothing on the wire leaves the intent new.
func TestReviewNoAttemptLeavesTheIntentNew(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := e.newIntent(t, "checkout:never", 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.client.Do(ctx, in)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, idem.StateNew, in.State())
	assert.Equal(t, 0, e.srv.Stats().Requests)
}

// A 303 after a POST is followed with a GET, and a GET never carries the
// key (contract section 8).
func TestReviewRedirectToGETCarriesNoKey(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	var mu sync.Mutex
	var getKeys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/old/payments" {
			http.Redirect(w, r, "/payments", http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodGet {
			mu.Lock()
			getKeys = append(getKeys, r.Header.Get("Idempotency-Key"))
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/old/payments", map[string]any{"amount": 1, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	_, _ = c.Do(context.Background(), in)
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, getKeys, "a redirect that turns the POST into a GET is not followed, so no GET carries the key")
}

// deleteGate holds Delete until released, and says when one starts.
type deleteGate struct {
	persist.Store
	entered chan struct{}
	release chan struct{}
}

func (s deleteGate) Delete(ctx context.Context, key string) error {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Delete(ctx, key)
}

// Intent drops an unsent intent for a changed cart; a Do of the old intent
// that starts while the drop is under way must not send it, or the old cart
// and the new one are both paid.
func TestReviewDroppedIntentIsNeverSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	store := deleteGate{Store: persist.NewMemory(nil), entered: make(chan struct{}, 1), release: make(chan struct{})}
	c := e.newClient(t, idem.WithStore(store))
	old, err := c.Intent(ctx, "checkout:race", e.paymentRequest(t, 100, "cus_1"))
	require.NoError(t, err)

	type result struct {
		in  *idem.Intent
		err error
	}
	replaced := make(chan result, 1)
	go func() {
		in, err := c.Intent(ctx, "checkout:race", e.paymentRequest(t, 200, "cus_1"))
		replaced <- result{in, err}
	}()
	<-store.entered // the old intent is being dropped
	_, err = c.Do(ctx, old)
	assert.ErrorIs(t, err, idem.ErrIntentReplaced, "the dropped intent must not be sent")
	close(store.release)
	r := <-replaced
	require.NoError(t, r.err)
	_, err = c.Do(ctx, r.in)
	require.NoError(t, err)
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	_, err = c.Do(ctx, old)
	assert.Error(t, err, "nor later")
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
}
