package idem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// keyRecorder is the real fake server's handler with the Idempotency-Key of
// every request written down on the way in.
type keyRecorder struct {
	next http.Handler
	mu   sync.Mutex
	keys map[string][]string // "METHOD path" -> keys seen
}

func (k *keyRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	k.keys[r.Method+" "+r.URL.Path] = append(k.keys[r.Method+" "+r.URL.Path], r.Header.Get("Idempotency-Key"))
	k.mu.Unlock()
	k.next.ServeHTTP(w, r)
}

func (k *keyRecorder) seen(route string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys[route]...)
}

func TestRoundTripper(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	rec := &keyRecorder{next: h, keys: map[string][]string{}}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	c, err := idem.NewWith(idem.WithClock(clk))
	require.NoError(t, err)
	hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
	const body = `{"amount":300,"currency":"AZN","customer":"cus_1"}`

	t.Run("POST gets one key for all its retries", func(t *testing.T) {
		require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		resp, err := hc.Post(srv.URL+"/payments", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
		assert.Contains(t, string(got), `"amount":300`)
		keys := rec.seen("POST /payments")
		require.Len(t, keys, 2)
		assert.NotEmpty(t, keys[0])
		assert.Equal(t, keys[0], keys[1])
		assert.Equal(t, 1, h.Stats().ProviderCharges)
	})

	t.Run("GET never carries a key", func(t *testing.T) {
		resp, err := hc.Get(srv.URL + "/payments")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, []string{""}, rec.seen("GET /payments"))
	})

	t.Run("PUT passes through without a key", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPut, srv.URL+"/orders/o1/status", strings.NewReader(`{"status":"SHIPPED"}`))
		require.NoError(t, err)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, []string{""}, rec.seen("PUT /orders/o1/status"))
	})

	t.Run("a final 4xx is a response, not an error", func(t *testing.T) {
		resp, err := hc.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":1,"currency":"AZN","customer":"cus_declined"}`))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
	})

	t.Run("the intent in the context gives the key", func(t *testing.T) {
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 42, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)

		httpReq, err := http.NewRequestWithContext(idem.ContextWithIntent(context.Background(), in), http.MethodPost, req.URL, strings.NewReader(string(req.Body)))
		require.NoError(t, err)
		resp, err := hc.Do(httpReq)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		keys := rec.seen("POST /payments")
		assert.Equal(t, in.Key(), keys[len(keys)-1])
		assert.Equal(t, persist.StateSucceeded, in.State())

		// Another body under the same intent is refused before sending.
		n := len(keys)
		httpReq, err = http.NewRequestWithContext(idem.ContextWithIntent(context.Background(), in), http.MethodPost, req.URL, strings.NewReader(`{"amount":43}`))
		require.NoError(t, err)
		_, err = hc.Do(httpReq)
		require.ErrorIs(t, err, idem.ErrIntentMismatch)
		assert.Len(t, rec.seen("POST /payments"), n)
	})
}

// Through the RoundTripper, a final answer larger than the limit is still
// the answer: its status, with an empty body, and the intent is resolved.
func TestRoundTripperReturnsAnOversizedAnswerWithoutItsBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(marking(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(strings.Repeat("x", 4096)))
	})))
	t.Cleanup(srv.Close)
	c, err := idem.NewWith(idem.WithClock(clock.NewManual(epoch)), idem.WithMaxResponseBytes(1024))
	require.NoError(t, err)
	hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
	resp, err := hc.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Empty(t, body)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
}

// An API client that sets its own Idempotency-Key (as Stripe's SDKs do)
// and retries with it after an error keeps its promise through the
// RoundTripper: every attempt carries the caller's key, so the server
// charges once.
func TestRoundTripperKeepsTheCallersKeyAcrossItsRetries(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	rec := &keyRecorder{next: h, keys: map[string][]string{}}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	c, err := idem.NewWith(idem.WithClock(clk), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
	const body = `{"amount":300,"currency":"AZN","customer":"cus_1"}`
	post := func() (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "sdk-key-1")
		return hc.Do(req)
	}

	require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
	_, err = post()
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the answer was lost")
	resp, err := post() // the SDK's own retry
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, []string{"sdk-key-1", "sdk-key-1"}, rec.seen("POST /payments"))
	assert.Equal(t, 1, h.Stats().ProviderCharges)
}

// A request that carries a stored intent's key is that intent, whether it
// came through Client.Do or through the RoundTripper: an attempt sent
// either way keeps a "not found" from being trusted until it can no longer
// arrive.
func TestRoundTripperTreatsAStoredIntentsKeyAsThatIntent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clock.NewManual(epoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	net := &heldNetwork{base: srv.Client().Transport}
	c, err := idem.NewWith(idem.WithClock(clk), idem.WithLookup(contractLookup), idem.WithHTTPClient(&http.Client{Transport: net}), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	req := payment1500(t, srv)
	in, err := c.Intent(ctx, "checkout", req)
	require.NoError(t, err)
	require.NoError(t, idem.Arm(c, ctx, in))
	clk.Advance(10 * time.Minute)

	// The app sends the intent's request itself, with the intent's key.
	hc := &http.Client{Transport: c.RoundTripper(net)}
	httpReq, err := http.NewRequest(http.MethodPost, req.URL, bytes.NewReader(req.Body))
	require.NoError(t, err)
	httpReq.Header = req.Header.Clone()
	httpReq.Header.Set("Idempotency-Key", in.Key())
	net.holdNext(1) // held in the network
	_, err = hc.Do(httpReq)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	_, err = c.Reconcile(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the attempt may still arrive")
	net.deliver(t)
	assert.Equal(t, 1, srv.Stats().Payments)
	assert.NotEqual(t, persist.StateVoid, in.State())
}

// An API client whose own retry loop sends the same *http.Request again,
// after the RoundTripper's short budget lost the answer, sends the same
// key: one charge. The caller's request is not changed, nor kept alive; a
// clone is another request.
func TestTheRoundTripperGivesTheSameRequestTheSameKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.client.RoundTripper(e.srv.Client().Transport)
	hc := &http.Client{Transport: rt}
	req := e.paymentRequest(t, 1500, "cus_1")
	tap := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1})
	httpReq, err := http.NewRequestWithContext(tap, http.MethodPost, req.URL, bytes.NewReader(req.Body))
	require.NoError(t, err)
	httpReq.Header = req.Header.Clone()

	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
	_, err = hc.Do(httpReq)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Empty(t, httpReq.Header.Get("Idempotency-Key"), "the caller's request is not changed")

	resp, err := hc.Do(httpReq) // the API client's own retry
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the same key: the server's replay")
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)

	clone := httpReq.Clone(context.Background())
	clone.Body, _ = httpReq.GetBody()
	resp, err = hc.Do(clone)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, e.srv.Stats().ProviderCharges, "a clone is a new request, with a new key")

	httpReq, clone = nil, nil
	require.Eventually(t, func() bool {
		runtime.GC()
		return idem.Remembered(rt) == 0
	}, 10*time.Second, time.Millisecond, "requests the caller dropped are forgotten")
}

// An API client that puts its own key on the request quoted, as the IETF
// draft spells it, gets the server's answer: its echo, quoted as received,
// names the same key.
func TestRoundTripperTakesTheEchoOfACallersQuotedKey(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := idem.NewWith(idem.WithClock(clk))
	require.NoError(t, err)
	hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"sdk-key-2"`)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, `"sdk-key-2"`, resp.Header.Get("Idempotency-Key"))
}

// An API client's own retry with its own key, after its first request
// charged and the answer was lost, may get a gateway's refusal: that is
// not "not paid", since the key was sent before, through an earlier round
// trip.
func TestRoundTripperNeverTakesAStrangersRefusalOfACallersRetry(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && posts.Add(1) == 2 {
			strangerPage(w, http.StatusUnauthorized, "application/json", `{"message":"Unauthorized"}`)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := idem.NewWith(idem.WithClock(clk), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
	post := func() (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "sdk-key-3")
		return hc.Do(req)
	}
	require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
	_, err = post()
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the answer was lost")
	_, err = post()
	requireStop(t, err, idem.StopUnmarked, "the gateway's 401 says nothing of the charge")
	resp, err := post()
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, h.Stats().ProviderCharges)
}

// An API client that builds its request from a stream has no GetBody: the
// RoundTripper reads the body once. When the API client sends the same
// request again after a lost answer, its body is spent; what goes on the
// wire, if anything, is the payment's bytes with its key, never an empty
// POST whose 4xx would say that a payment the server made failed.
func TestARequestWhoseBodyWasSpentIsNeverResentEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.client.RoundTripper(e.srv.Client().Transport)
	hc := &http.Client{Transport: rt}
	req := e.paymentRequest(t, 1500, "cus_1")
	tap := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1})
	httpReq, err := http.NewRequestWithContext(tap, http.MethodPost, req.URL, io.MultiReader(bytes.NewReader(req.Body)))
	require.NoError(t, err)
	require.Nil(t, httpReq.GetBody, "a stream: no GetBody")
	httpReq.Header = req.Header.Clone()

	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
	_, err = hc.Do(httpReq)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 1, e.srv.Stats().ProviderCharges, "the server charged")

	resp, err := hc.Do(httpReq) // the API client's own retry
	if err == nil {
		defer resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode, "the payment was made: no answer may say otherwise")
	}
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
}

// Most API clients set http.Client.Timeout. Such a client hands the
// RoundTripper a shallow fork of the caller's request on every Do (net/http
// forks it to bind the deadline): the same *http.Request, sent again by the
// API client's own retry, is still the same request and gets the same key.
func TestTheRoundTripperGivesTheSameRequestTheSameKeyUnderAClientTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.client.RoundTripper(e.srv.Client().Transport)
	hc := &http.Client{Transport: rt, Timeout: time.Minute}
	req := e.paymentRequest(t, 1500, "cus_1")
	tap := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1})
	httpReq, err := http.NewRequestWithContext(tap, http.MethodPost, req.URL, bytes.NewReader(req.Body))
	require.NoError(t, err)
	httpReq.Header = req.Header.Clone()

	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
	_, err = hc.Do(httpReq)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	resp, err := hc.Do(httpReq) // the API client's own retry
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the same key: the server's replay")
	assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "one payment")
}

// A new request that shares an earlier request's *url.URL (as net/http's
// own copies do) is still a new request when its bytes, or its streamed
// body, differ: the URL alone never makes two requests one, nor sends one
// request's bytes for another.
func TestTheRoundTripperNeverTakesARequestSharingAURLForAnotherRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		second  io.Reader
		charges int
	}{
		{"other bytes", strings.NewReader(`{"amount":900,"currency":"AZN","customer":"cus_2","description":"cart"}`), 2},
		{"an empty stream of its own", io.MultiReader(), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			hc := &http.Client{Transport: e.client.RoundTripper(e.srv.Client().Transport), Timeout: time.Minute}
			req := e.paymentRequest(t, 1500, "cus_1")
			u, err := url.Parse(req.URL)
			require.NoError(t, err)
			send := func(body io.Reader) *http.Response {
				r, err := http.NewRequest(http.MethodPost, req.URL, body)
				require.NoError(t, err)
				r.URL = u // shared by both requests
				r.Header = req.Header.Clone()
				resp, err := hc.Do(r)
				require.NoError(t, err)
				resp.Body.Close()
				return resp
			}
			first := send(io.MultiReader(bytes.NewReader(req.Body)))
			require.Equal(t, http.StatusCreated, first.StatusCode)
			second := send(tc.second)
			assert.Empty(t, second.Header.Get("Idempotent-Replayed"), "another request, not a replay of the first")
			assert.NotEqual(t, first.Header.Get("Location"), second.Header.Get("Location"), "never the first request's answer")
			assert.Equal(t, tc.charges, e.srv.Stats().ProviderCharges)
		})
	}
}
