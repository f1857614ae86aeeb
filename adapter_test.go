package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/persist"
)

// redirectingServer puts routes in front of the fake server's handler and
// records every request that reaches it.
type redirectingServer struct {
	*httptest.Server
	h    *fakeserver.Handler
	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	method, path, key, body string
}

func newRedirectingServer(t *testing.T, routes map[string]func(w http.ResponseWriter, r *http.Request)) *redirectingServer {
	t.Helper()
	s := &redirectingServer{h: fakeserver.NewHandler(&fakeserver.Options{Clock: clock.NewManual(epoch)})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, seenRequest{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), string(body)})
		s.mu.Unlock()
		if route, ok := routes[r.Method+" "+r.URL.Path]; ok {
			route(w, r)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *redirectingServer) requests() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenRequest(nil), s.seen...)
}

func redirectTo(code int, location string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, location, code) }
}

func TestARedirectedGETIsNeverTheOutcome(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			srv := newRedirectingServer(t, map[string]func(http.ResponseWriter, *http.Request){
				"POST /payments": redirectTo(code, "/login"),
				"GET /login": func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/html")
					_, _ = io.WriteString(w, "<html>Sign in</html>")
				},
			})
			c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)))
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "", req)
			require.NoError(t, err)

			_, err = c.Do(context.Background(), in)
			var retryErr *idem.RetryError
			require.ErrorAs(t, err, &retryErr, "a %d says nothing about the work", code)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.Equal(t, idem.StopRedirect, retryErr.Reason)
			require.NotNil(t, retryErr.LastResponse)
			assert.Equal(t, code, retryErr.LastResponse.StatusCode, "the 3xx is reported, with its Location")
			assert.Equal(t, "/login", retryErr.LastResponse.Header.Get("Location"))
			assert.False(t, in.State().Resolved(), "the login page is not stored as the payment's answer")
			seen := srv.requests()
			require.Len(t, seen, 1, "neither the GET nor a retry is made")
			assert.Equal(t, http.MethodPost, seen[0].method)
		})
	}
}

func TestARedirectAfterAnAttemptThatChargedLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	// The first attempt charges and its answer is lost; a login page in
	// front of the server answers the second with a redirect.
	hc := &http.Client{Transport: &loginAfterFirst{base: srv.Client().Transport}}
	c, err := idem.New(idem.WithHTTPClient(hc), idem.WithClock(clk))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	in, err := c.Intent(context.Background(), "checkout", req)
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))

	_, err = c.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "not a failure: the first attempt charged")
	assert.False(t, in.State().Resolved())
	assert.Equal(t, 1, srv.Stats().Payments)
	changed, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 2500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	_, err = c.Intent(context.Background(), "checkout", changed)
	require.ErrorAs(t, err, new(*idem.UnresolvedError), "the user cannot pay again while the first payment may be made")
}

func TestAReplayedRedirectIsFinal(t *testing.T) {
	t.Parallel()
	srv := newRedirectingServer(t, map[string]func(http.ResponseWriter, *http.Request){
		"POST /payments": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Idempotent-Replayed", "true")
			http.Redirect(w, r, "/payments/pay_1", http.StatusSeeOther)
		},
	})
	c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	resp, err := c.Do(context.Background(), in)
	var apiErr *idem.APIError
	require.ErrorAs(t, err, &apiErr, "the server's stored record for the key")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/payments/pay_1", resp.Header.Get("Location"))
	assert.True(t, in.State().Resolved())
	assert.Len(t, srv.requests(), 1)
}

// loginAfterFirst lets the first POST through and answers every later one
// with a redirect to a login page, as a proxy whose session expired.
type loginAfterFirst struct {
	base  http.RoundTripper
	mu    sync.Mutex
	posts int
}

func (l *loginAfterFirst) RoundTrip(req *http.Request) (*http.Response, error) {
	l.mu.Lock()
	l.posts++
	first := l.posts == 1 || req.Method != http.MethodPost
	l.mu.Unlock()
	if first {
		return l.base.RoundTrip(req)
	}
	return &http.Response{StatusCode: http.StatusFound, Status: "302 Found", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Location": {"/login"}}, Body: http.NoBody, Request: req}, nil
}

func TestA307Or308KeepsMethodKeyAndBody(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			srv := newRedirectingServer(t, map[string]func(http.ResponseWriter, *http.Request){
				"POST /v1/payments": redirectTo(code, "/payments"),
			})
			c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)), idem.WithQuotedKey())
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/v1/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "", req)
			require.NoError(t, err)

			resp, err := c.Do(context.Background(), in)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, idem.StateSucceeded, in.State())
			seen := srv.requests()
			require.Len(t, seen, 2)
			for _, r := range seen {
				assert.Equal(t, http.MethodPost, r.method)
				assert.Equal(t, `"`+in.Key()+`"`, r.key, "the key as spelled on the first request")
				assert.Equal(t, string(req.Body), r.body)
			}
		})
	}
}

// An edge in front of the server redirects the first POST to another URL
// of the same server (another query), where it is charged
// and its answer lost. The retry goes to the intent's own URL, whose
// fingerprint differs, and the server answers 422 key reused, marked as
// its own. That answer says nothing of the work: the payment was made, and
// the intent is settled by the lookup, not reported rejected.
func TestAKeyReuseAnswerAfterARedirectToAnotherURLLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, location := range []string{"/payments?via=edge", "/payments?region=eu&via=edge"} {
		t.Run(location, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewManual(epoch)
			h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
			var posts atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && r.URL.RequestURI() == "/payments" && posts.Add(1) == 1 {
					// On a connection of its own, so that net/http does not
					// resend the redirected request itself when its answer
					// is lost.
					w.Header().Set("Connection", "close")
					http.Redirect(w, r, location, http.StatusTemporaryRedirect)
					return
				}
				h.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk), idem.WithLookup(contractLookup),
				idem.WithRetryPolicy(idem.RetryPolicy{Jitter: -1}))
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			in, err := c.Intent(context.Background(), "checkout", req)
			require.NoError(t, err)
			require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))

			_, err = c.Do(context.Background(), in)
			var retryErr *idem.RetryError
			require.ErrorAs(t, err, &retryErr, "the payment was made under the redirected URL")
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.NotErrorIs(t, err, idem.ErrKeyReused)
			assert.Equal(t, idem.StopRedirectedKeyReused, retryErr.Reason)
			require.NotNil(t, retryErr.LastResponse)
			assert.Equal(t, http.StatusUnprocessableEntity, retryErr.LastResponse.StatusCode, "the 422 is reported")
			assert.False(t, in.State().Resolved(), "not rejected: the payment was made")
			assert.Equal(t, idem.StatePending, in.State())

			changed, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 2500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			_, err = c.Intent(context.Background(), "checkout", changed)
			require.ErrorAs(t, err, new(*idem.UnresolvedError), "the user cannot pay again while the first payment may be made")

			clk.Advance(5 * time.Minute) // past the reconcile delay
			resp, err := c.Settle(context.Background(), in)
			require.NoError(t, err, "the lookup is the server's word")
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, idem.StateSucceeded, in.State())
		})
	}
}

// The redirect is remembered with the intent: after a restart, the retry's
// key reuse answer still leaves the outcome unknown, and the lookup
// settles it.
func TestARedirectToAnotherURLIsRememberedAcrossARestart(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && posts.Add(1) == 1 {
			w.Header().Set("Connection", "close")
			http.Redirect(w, r, "/payments?via=edge", http.StatusTemporaryRedirect)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	store := persist.NewMemory(nil)
	client := func() *idem.Client {
		c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk), idem.WithStore(store), idem.WithLookup(contractLookup),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		return c
	}
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	before := client()
	in, err := before.Intent(context.Background(), "checkout", req)
	require.NoError(t, err)
	require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
	_, err = before.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the redirected request's answer was lost")

	settled, err := client().SettleAll(context.Background())
	require.NoError(t, err)
	require.Len(t, settled, 1)
	require.NoError(t, settled[0].Err, "the lookup is the server's word")
	assert.Equal(t, idem.StateSucceeded, settled[0].Intent.State(), "not rejected: the payment was made")
	assert.Equal(t, int32(3), posts.Load(), "the first POST, the redirected one, and one retry to the intent's own URL")
}

// Without a redirect to another URL, the server's key reuse answer is
// final: the request changed under its key, a bug in the caller. A
// redirect to the same URL does not change that.
func TestAKeyReuseAnswerWithoutARedirectToAnotherURLIsFinal(t *testing.T) {
	t.Parallel()
	var posts atomic.Int32
	c, req := answering(t, func(w http.ResponseWriter, r *http.Request) {
		if posts.Add(1) == 1 {
			http.Redirect(w, r, r.URL.RequestURI(), http.StatusTemporaryRedirect)
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"type":"https://idem.dev/problems/idempotency-key-reused","title":"Idempotency-Key reused","status":422}`)
	})
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	resp, err := c.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.Equal(t, idem.StateRejected, in.State())
	assert.Equal(t, int32(2), posts.Load())
}

// answering is a test server that answers every request with h, and a
// Client that sends to it on a manual clock.
//
// The server marks its answers as the contract asks (see marking).
func answering(t *testing.T, h http.HandlerFunc, opts ...idem.Option) (*idem.Client, idem.Request) {
	t.Helper()
	srv := httptest.NewServer(marking(h))
	t.Cleanup(srv.Close)
	base := []idem.Option{idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)), idem.WithLookup(contractLookup)}
	c, err := idem.New(append(base, opts...)...)
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	return c, req
}

// The last answer in a RetryError is never a replay: an answer the server
// marks as replayed from its record is final, whatever its status, so the
// call ends with it instead.
func TestRetryErrorLastResponseIsNeverAReplay(t *testing.T) {
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
}

// stalling is a test server whose answer to a POST is stall (which must
// return when the request's context ends or when stop is closed), and a
// Client that sends to it through an http.Client with no Timeout, on the
// system clock, with a short MaxElapsed.
func stalling(t *testing.T, stall func(w http.ResponseWriter, r *http.Request, stop <-chan struct{})) (*idem.Client, *idem.Intent) {
	t.Helper()
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { stall(w, r, stop) }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })                     // runs first: no handler stays blocked
	hc := &http.Client{Transport: srv.Client().Transport} // no Timeout, like http.DefaultClient
	c, err := idem.New(idem.WithHTTPClient(hc), idem.WithLookup(contractLookup), idem.WithRetryPolicy(idem.RetryPolicy{MaxElapsed: 200 * time.Millisecond}))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	require.NoError(t, idem.Arm(c, context.Background(), in))
	return c, in
}

// doWithin runs Do with a generous real deadline, far above the budget
// under test, so that a call the budget does not bound fails the test
// instead of hanging it.
func doWithin(t *testing.T, c *idem.Client, in *idem.Intent) (*idem.RetryError, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Do(ctx, in)
	took := time.Since(start)
	var retryErr *idem.RetryError
	require.ErrorAs(t, err, &retryErr)
	return retryErr, took
}

// MaxElapsed bounds an attempt that gets no answer at all, though the
// http.Client has no Timeout. The attempt may have reached the server: the
// outcome is unknown and the intent pending.
func TestMaxElapsedBoundsAnAttemptThatGetsNoAnswer(t *testing.T) {
	t.Parallel()
	c, in := stalling(t, func(_ http.ResponseWriter, r *http.Request, stop <-chan struct{}) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})
	retryErr, took := doWithin(t, c, in)
	assert.Equal(t, idem.StopElapsed, retryErr.Reason, "%v", retryErr)
	assert.ErrorIs(t, retryErr, idem.ErrOutcomeUnknown)
	assert.Equal(t, 1, retryErr.Attempts)
	assert.Less(t, took, 10*time.Second, "the budget is 200ms")
	assert.Equal(t, idem.StatePending, in.State())
}

// MaxElapsed bounds an attempt whose answer trickles in a byte at a time,
// each in time to keep a read timeout from firing.
func TestMaxElapsedBoundsAnAttemptWhoseAnswerTrickles(t *testing.T) {
	t.Parallel()
	c, in := stalling(t, func(w http.ResponseWriter, r *http.Request, stop <-chan struct{}) {
		w.Header().Set("Content-Length", "1000000")
		w.WriteHeader(http.StatusCreated)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-stop:
				return
			case <-tick.C:
				if _, err := w.Write([]byte(" ")); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}
	})
	retryErr, took := doWithin(t, c, in)
	assert.Equal(t, idem.StopElapsed, retryErr.Reason, "%v", retryErr)
	assert.ErrorIs(t, retryErr, idem.ErrOutcomeUnknown)
	assert.Equal(t, 1, retryErr.Attempts)
	assert.Less(t, took, 10*time.Second, "the budget is 200ms")
	assert.Equal(t, idem.StatePending, in.State())
}

// An attempt gets what is left of the budget on the Client's clock: after a
// Retry-After wait of 2s on a manual clock, a second attempt under a
// MaxElapsed of 2.3s gets 300ms of real time.
func TestAnAttemptGetsTheBudgetLeftOnTheClock(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if posts.Add(1) == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		select { // the second attempt gets no answer
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })
	clk := clock.NewManual(epoch)
	c, err := idem.New(idem.WithHTTPClient(&http.Client{Transport: srv.Client().Transport}), idem.WithClock(clk),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxElapsed: 2300 * time.Millisecond, Jitter: -1}))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)

	retryErr, took := doWithin(t, c, in)
	assert.Equal(t, idem.StopElapsed, retryErr.Reason, "%v", retryErr)
	assert.Equal(t, 2, retryErr.Attempts)
	assert.Equal(t, []time.Duration{2 * time.Second}, clk.Sleeps())
	assert.Less(t, took, 10*time.Second, "300ms were left")
}

// idleRecorder is a transport that fails every request and counts the
// calls of CloseIdleConnections.
type idleRecorder struct{ closed atomic.Int32 }

func (r *idleRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	return nil, errors.New("connection refused")
}

func (r *idleRecorder) CloseIdleConnections() { r.closed.Add(1) }

// A call that ends without an answer closes the app's transport's idle
// connections, as go-retryablehttp does, through the budget's wrapper.
func TestAFailedCallClosesTheTransportsIdleConnections(t *testing.T) {
	t.Parallel()
	tr := &idleRecorder{}
	c, err := idem.New(idem.WithHTTPClient(&http.Client{Transport: tr}), idem.WithClock(clock.NewManual(epoch)),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2}))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, "http://127.0.0.1:9/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	_, err = c.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Positive(t, tr.closed.Load())
}

// A wait that uses up the budget to the last instant leaves no time for the
// attempt after it: nothing more is sent, and the attempt is not counted.
func TestNoAttemptStartsWithNoBudgetLeft(t *testing.T) {
	t.Parallel()
	var posts atomic.Int32
	c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
		posts.Add(1)
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
	}, idem.WithRetryPolicy(idem.RetryPolicy{MaxElapsed: 2 * time.Second, Jitter: -1}))
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	_, err = c.Do(context.Background(), in)
	var retryErr *idem.RetryError
	require.ErrorAs(t, err, &retryErr)
	assert.Equal(t, idem.StopElapsed, retryErr.Reason)
	assert.Equal(t, 1, retryErr.Attempts)
	assert.Equal(t, int32(1), posts.Load())
}

// chunked makes every answer of h chunked: it drops Content-Length and
// flushes after each write, so a cut in the body is a missing chunk rather
// than a short Content-Length.
type chunked struct{ h http.Handler }

type chunkedWriter struct{ http.ResponseWriter }

func (w chunkedWriter) WriteHeader(code int) {
	w.Header().Del("Content-Length")
	w.ResponseWriter.WriteHeader(code)
}

func (w chunkedWriter) Write(p []byte) (int, error) {
	// Two chunks, so a cut can fall between them.
	half := len(p) / 2
	n, err := w.ResponseWriter.Write(p[:half])
	if err != nil {
		return n, err
	}
	w.ResponseWriter.(http.Flusher).Flush()
	m, err := w.ResponseWriter.Write(p[half:])
	w.ResponseWriter.(http.Flusher).Flush()
	return n + m, err
}

func (c chunked) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.h.ServeHTTP(chunkedWriter{w}, r)
}

// attemptLog collects the attempts of a client.
type attemptLog struct {
	mu sync.Mutex
	a  []idem.Attempt
}

func (l *attemptLog) hook(a idem.Attempt) {
	l.mu.Lock()
	l.a = append(l.a, a)
	l.mu.Unlock()
}

func (l *attemptLog) all() []idem.Attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]idem.Attempt(nil), l.a...)
}

// TestBrokenConnectionsBelowHTTP cuts the first connection of a payment at
// each point below HTTP, through a TCP proxy: the cut attempt is an error,
// never a success, and the retry with the same key ends with one charge and
// the answer the server stored.
func TestBrokenConnectionsBelowHTTP(t *testing.T) {
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
	c, err := idem.New(
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
	assert.Equal(t, idem.StateSucceeded, in.State())
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

// An attempt cut short by the caller's cancel is counted, and the attempt
// hook hears of it like any other.
func TestTheAttemptHookHearsOfAnAttemptCutShortByCancellation(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })
	var mu sync.Mutex
	var heard []idem.Attempt
	c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)),
		idem.WithAttemptHook(func(a idem.Attempt) { mu.Lock(); heard = append(heard, a); mu.Unlock() }))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	_, err = c.Do(ctx, in)
	var re *idem.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Attempts)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, heard, 1, "the counted attempt is reported")
	assert.Equal(t, 1, heard[0].Number)
	assert.Error(t, heard[0].Err)
}
