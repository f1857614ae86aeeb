package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// stalling is a Client that sends through an http.Client with no Timeout
// to rt, a server in the process whose answer to a POST is stalled until
// the request's context ends, on the system clock, with a MaxElapsed of
// 200ms (opts may replace it). It is called inside a synctest bubble: the time the budget counts
// passes only while every goroutine waits, so no test depends on the
// machine's speed, and an unbounded call fails the test (doWithin) rather
// than hanging it.
func stalling(t *testing.T, rt roundTripFunc, opts ...idem.Option) (*idem.Client, *idem.Intent) {
	t.Helper()
	hc := &http.Client{Transport: rt} // no Timeout, like http.DefaultClient
	c, err := idem.NewWith(append([]idem.Option{idem.WithHTTPClient(hc), idem.WithLookup(contractLookup), idem.WithRetryPolicy(idem.RetryPolicy{MaxElapsed: 200 * time.Millisecond})}, opts...)...)
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, "http://api.example/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	require.NoError(t, idem.Arm(c, context.Background(), in))
	return c, in
}

// noAnswer is a server that reads the request and never answers.
func noAnswer(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// trickle is a body of which each byte comes 10ms after the last, each in
// time to keep a read timeout from firing, until ctx ends.
type trickle struct{ ctx context.Context }

func (b trickle) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	select {
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	case <-time.After(10 * time.Millisecond):
		p[0] = ' '
		return 1, nil
	}
}

func (trickle) Close() error { return nil }

// doWithin runs Do under a deadline of 20s, far above the budget under
// test, so that a call the budget does not bound fails the test instead
// of hanging it, and returns how long the call took on the bubble's
// clock.
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

// cutByTheBudget runs Do (doWithin) on an intent of stalling whose one
// attempt gets no answer in time, and checks that the 200ms budget ended
// the call: its outcome is unknown, not by the caller's deadline, after
// one attempt and exactly the budget, and the intent is pending.
func cutByTheBudget(t *testing.T, c *idem.Client, in *idem.Intent) {
	t.Helper()
	retryErr, took := doWithin(t, c, in)
	assert.Equal(t, idem.StopElapsed, retryErr.Reason, "%v", retryErr)
	assert.ErrorIs(t, retryErr, idem.ErrOutcomeUnknown)
	assert.NotErrorIs(t, retryErr, context.DeadlineExceeded, "the budget ended the call, not the caller's context")
	assert.Equal(t, 1, retryErr.Attempts)
	assert.Equal(t, 200*time.Millisecond, took, "the budget")
	assert.Equal(t, persist.StatePending, in.State())
}

// TestMaxElapsed keeps RetryPolicy.MaxElapsed a bound on a whole call,
// whatever the server does and whatever the http.Client's Timeout.
func TestMaxElapsed(t *testing.T) {
	t.Parallel()

	// MaxElapsed bounds an attempt that gets no answer at all, though the
	// http.Client has no Timeout. The attempt may have reached the server: the
	// outcome is unknown and the intent pending.
	t.Run("it bounds an attempt that gets no answer", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c, in := stalling(t, noAnswer)
			cutByTheBudget(t, c, in)
		})
	})

	// MaxElapsed bounds an attempt whose answer trickles in a byte at a time,
	// each in time to keep a read timeout from firing.
	t.Run("it bounds an attempt whose answer trickles", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c, in := stalling(t, func(req *http.Request) (*http.Response, error) {
				return &http.Response{
					StatusCode: http.StatusCreated, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
					Header:        http.Header{"Content-Length": {"1000000"}},
					ContentLength: 1000000, Body: trickle{req.Context()}, Request: req,
				}, nil
			})
			cutByTheBudget(t, c, in)
		})
	})

	// The attempt hook hears of an attempt that MaxElapsed cut with the
	// budget's error, as the *RetryError carries it: not the
	// context.DeadlineExceeded of the caller's own deadline, which an app's
	// metrics count apart.
	t.Run("the hook hears of an attempt it cut with the budget's error", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			var heard []idem.Attempt
			c, in := stalling(t, noAnswer, idem.WithAttemptHook(func(a idem.Attempt) { heard = append(heard, a) }))
			retryErr, _ := doWithin(t, c, in)
			require.Equal(t, idem.StopElapsed, retryErr.Reason, "%v", retryErr)
			require.Len(t, heard, 1)
			require.Error(t, heard[0].Err)
			assert.NotErrorIs(t, heard[0].Err, context.DeadlineExceeded, "the budget cut the attempt, not the caller's context")
			assert.Equal(t, retryErr.Err.Error(), heard[0].Err.Error())
			assert.Contains(t, heard[0].Err.Error(), "max elapsed time reached")
		})
	})

	// An attempt gets what is left of the budget on the Client's clock: after a
	// Retry-After wait of 2s on a manual clock, a second attempt under a
	// MaxElapsed of 2.3s gets 300ms.
	t.Run("an attempt gets the budget left on the clock", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			var posts atomic.Int32
			rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if posts.Add(1) == 1 {
					return &http.Response{
						StatusCode: http.StatusServiceUnavailable, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
						Header: http.Header{"Retry-After": {"2"}}, Body: http.NoBody, Request: req,
					}, nil
				}
				return noAnswer(req) // the second attempt gets no answer
			})
			clk := clock.NewManual(epoch)
			c, err := idem.NewWith(idem.WithHTTPClient(&http.Client{Transport: rt}), idem.WithClock(clk),
				idem.WithRetryPolicy(idem.RetryPolicy{MaxElapsed: 2300 * time.Millisecond, Jitter: -1}))
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, "http://api.example/payments", map[string]any{"amount": 100})
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "", req)
			require.NoError(t, err)

			retryErr, took := doWithin(t, c, in)
			assert.Equal(t, idem.StopElapsed, retryErr.Reason, "%v", retryErr)
			assert.Equal(t, 2, retryErr.Attempts)
			assert.Equal(t, []time.Duration{2 * time.Second}, clk.Sleeps())
			assert.Equal(t, 300*time.Millisecond, took, "300ms were left")
		})
	})

	// A wait that uses up the budget to the last instant leaves no time for the
	// attempt after it: nothing more is sent, and the attempt is not counted.
	t.Run("no attempt starts with no budget left", func(t *testing.T) {
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
	})
}

// idleRecorder is a transport that fails every request and counts the
// calls of CloseIdleConnections.
type idleRecorder struct{ closed atomic.Int32 }

func (r *idleRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	return nil, errors.New("connection refused")
}

func (r *idleRecorder) CloseIdleConnections() { r.closed.Add(1) }

// TestBudgetTransport checks the transport that bounds each attempt.
func TestBudgetTransport(t *testing.T) {
	t.Parallel()
	// The base transport's answer names another request (a copy on
	// another context), or none. The answer is still this attempt's: Do
	// records it, and never panics.
	ctx := context.Background()
	srv := fakeserver.NewServer(&fakeserver.Options{})
	t.Cleanup(srv.Close)
	base := srv.Client().Transport
	for _, tc := range []struct {
		name string
		rt   roundTripFunc
	}{
		{"an answer that names a copy on another context is this attempt's", func(req *http.Request) (*http.Response, error) {
			return base.RoundTrip(req.WithContext(context.Background()))
		}},
		{"an answer that names no request is this attempt's", func(req *http.Request) (*http.Response, error) {
			resp, err := base.RoundTrip(req)
			if resp != nil {
				resp.Request = nil
			}
			return resp, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := idem.New(idem.Config{HTTPClient: &http.Client{Transport: tc.rt}, Server: echoLookupServer})
			require.NoError(t, err)
			in, err := c.Intent(ctx, "checkout-"+tc.name, payment1500(t, srv))
			require.NoError(t, err)
			resp, panicked, err := doRecovering(ctx, c, in)
			t.Logf("Do: resp %v, err %v, state %s", resp != nil, err, in.State())
			require.Nil(t, panicked, "Do panics: the app crashes after the server charged")
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, persist.StateSucceeded, in.State())
		})
	}

	// The app's transport follows redirects itself (go-retryablehttp's own
	// RoundTripper). A captive portal answers the POST with a 307 to its
	// JSON API on another origin. The answer names the redirected request,
	// whose chain leads back to the portal. That chain is kept, so the
	// portal's JSON never settles the intent (fromAnotherOrigin).
	t.Run("an answer reached by the base transport's own redirects keeps them", func(t *testing.T) {
		t.Parallel()
		portalAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"sess_8f2c","status":"login_required"}`))
		}))
		t.Cleanup(portalAPI.Close)
		portal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, portalAPI.URL+"/api/v1/sessions", http.StatusTemporaryRedirect)
		}))
		t.Cleanup(portal.Close)

		inner := retryablehttp.NewClient()
		inner.RetryMax = 0
		inner.Logger = nil
		follows := &retryablehttp.RoundTripper{Client: inner}
		for _, rt := range []http.RoundTripper{
			follows,
			// The same on a context of its own, so the answer names a copy.
			roundTripFunc(func(r *http.Request) (*http.Response, error) {
				return follows.RoundTrip(r.WithContext(context.Background()))
			}),
		} {
			c, err := idem.New(idem.Config{Store: persist.NewMemory(nil), HTTPClient: &http.Client{Transport: rt},
				Server:      idem.Server{Mark: idem.MarkJSONID("id"), LookupQuery: "idempotency_key"},
				RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, portal.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "checkout:cart-7", req)
			require.NoError(t, err)
			resp, err := c.Do(context.Background(), in)
			t.Logf("Do: resp %v, err %v, state %s", resp != nil, err, in.State())
			assert.Error(t, err, "the portal's JSON is told as the payment's answer")
			assert.False(t, in.State().Resolved(), "the portal's JSON answer settled the intent (%s)", in.State())
		}
	})
}

// doRecovering is a.Do(ctx, in), with a panic of Do returned rather than
// crashing the test binary.
func doRecovering(ctx context.Context, a *idem.Client, in *idem.Intent) (resp *idem.Response, panicked any, err error) {
	defer func() { panicked = recover() }()
	resp, err = a.Do(ctx, in)
	return resp, nil, err
}
