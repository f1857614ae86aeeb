package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
	// post sends body as the API client does, for the action name.
	post := func(name, body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(idem.ContextWithAction(context.Background(), name), http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		return hc.Do(req)
	}

	t.Run("POST gets one key for all its retries", func(t *testing.T) {
		require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		resp, err := post("cart-1", body)
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
		resp, err := post("cart-2", `{"amount":1,"currency":"AZN","customer":"cus_declined"}`)
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

	// Through the RoundTripper, a final answer larger than the limit is still
	// the answer: its status, with an empty body, and the intent is resolved.
	t.Run("an oversized answer is returned without its body", func(t *testing.T) {
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
		req, err := http.NewRequestWithContext(idem.ContextWithAction(context.Background(), "cart"), http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Empty(t, body)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	})

	// An API client's own retry with its own key, after its first request
	// charged and the answer was lost, may get a gateway's refusal: that is
	// not "not paid", since the key was sent before, through an earlier round
	// trip, of this RoundTripper or of one that no longer runs (the app
	// restarted).
	t.Run("it never takes a stranger's refusal of a caller's retry", func(t *testing.T) {
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
		// down makes every dial fail: nothing of the request is written.
		var down atomic.Bool
		base := srv.Client().Transport.(*http.Transport).Clone()
		base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if down.Load() {
				return nil, errors.New("network is unreachable")
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		var hc *http.Client
		start := func() { // the app starts: a new Client, a new RoundTripper
			c, err := idem.NewWith(idem.WithClock(clk), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
			require.NoError(t, err)
			hc = &http.Client{Transport: c.RoundTripper(base)}
		}
		post := func() (*http.Response, error) {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "sdk-key-3")
			return hc.Do(req)
		}
		start()
		require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		_, err := post()
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the answer was lost")
		start() // the API client's retry comes after a restart
		// Offline: no try of this process writes the request, but the first
		// process's try was charged. A key the caller chose may have been sent
		// by its own earlier try: this is never "not sent".
		down.Store(true)
		_, err = post()
		require.Error(t, err)
		assert.NotErrorIs(t, err, idem.ErrNotSent, "the caller's first try was charged")
		down.Store(false)
		_, err = post()
		requireStop(t, err, idem.StopUnmarked, "the gateway's 401 says nothing of the charge")
		resp, err := post()
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
		assert.Equal(t, 1, h.Stats().ProviderCharges)
	})

	// An API client that builds its request from a stream has no GetBody: the
	// RoundTripper reads the body once. When the API client sends the same
	// request again after a lost answer, its body is spent; what goes on the
	// wire, if anything, is the payment's bytes with its key, never an empty
	// POST whose 4xx would say that a payment the server made failed.
	t.Run("a request whose body was spent is never resent empty", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		rt := e.client.RoundTripper(e.srv.Client().Transport)
		hc := &http.Client{Transport: rt}
		req := e.paymentRequest(t, 1500, "cus_1")
		tap := idem.ContextWithAction(idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1}), "checkout")
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
	})
}

// authTransport is an API client's auth layer on top of the Client's
// RoundTripper: it sets a fresh token on a clone of each request, as
// oauth2.Transport does.
type authTransport struct {
	base http.RoundTripper
	n    atomic.Int32
}

func (a *authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	clone := r.Clone(r.Context())
	clone.Header.Set("Authorization", fmt.Sprintf("Bearer test_acme_%d", a.n.Add(1)))
	return a.base.RoundTrip(clone)
}

// TestRoundTripperIdentity keeps the RoundTripper's rule of identity: a
// request is the intent the app states, never the object that carries it.
func TestRoundTripperIdentity(t *testing.T) {
	t.Parallel()

	t.Run("a clone through an auth transport and the API client's retry are one payment", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
		rec := &keyRecorder{next: h, keys: map[string][]string{}}
		srv := httptest.NewServer(rec)
		t.Cleanup(srv.Close)
		store := persist.NewMemory(nil)
		c, err := idem.NewWith(idem.WithClock(clk), idem.WithStore(store), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		hc := &http.Client{Transport: &authTransport{base: c.RoundTripper(srv.Client().Transport)}}
		ctx := idem.ContextWithAction(context.Background(), "checkout:cart-9")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")

		require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		var resp *http.Response
		for range 3 { // the API client's own retry loop
			if resp, err = hc.Do(req); err == nil {
				break
			}
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the answer was lost")
		}
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the retry is the same payment")
		keys := rec.seen("POST /payments")
		require.Len(t, keys, 2)
		assert.Equal(t, keys[0], keys[1], "one key")
		assert.Equal(t, 1, h.Stats().ProviderCharges, "one charge")

		in, err := c.Load(context.Background(), keys[0])
		require.NoError(t, err, "the action's intent is stored")
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, "checkout:cart-9", in.Name())
		assert.Empty(t, in.Request().Header.Get("Authorization"), "the token goes on the wire only")
		assert.Equal(t, "application/json", in.Request().Header.Get("Content-Type"))
	})

	t.Run("a caller's key resent after the server's retention is never sent again", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
		rec := &keyRecorder{next: h, keys: map[string][]string{}}
		srv := httptest.NewServer(rec)
		t.Cleanup(srv.Close)
		c, err := idem.NewWith(idem.WithClock(clk), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		hc := &http.Client{Transport: &authTransport{base: c.RoundTripper(srv.Client().Transport)}}
		post := func() error {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "sdk-key-late")
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		require.ErrorIs(t, post(), idem.ErrOutcomeUnknown, "the answer was lost")
		clk.Advance(25 * time.Hour) // the server forgot the key
		err = post()                // the API client's retry, a day late
		requireStop(t, err, idem.StopExpired, "the key's age counts from its first send")
		assert.Len(t, rec.seen("POST /payments"), 1, "never sent again")
		assert.Equal(t, 1, h.Stats().ProviderCharges)
	})

	t.Run("a POST that states no identity is refused and nothing is sent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		hc := &http.Client{Transport: e.client.RoundTripper(e.srv.Client().Transport)}
		for _, method := range []string{http.MethodPost, http.MethodPatch} {
			req, err := http.NewRequest(method, e.srv.URL+"/payments", strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
			require.NoError(t, err)
			_, err = hc.Do(req)
			require.ErrorIs(t, err, idem.ErrNoIdentity, "never a fresh key")
		}
		assert.Zero(t, e.srv.Stats().Requests, "nothing reached the server")
		left, err := e.client.Unresolved(context.Background())
		require.NoError(t, err)
		assert.Empty(t, left, "no intent was made")
	})

	// An API client whose own retry loop sends the same *http.Request again,
	// after the RoundTripper's short budget lost the answer, sends the same
	// key: one charge. The caller's request is not changed; a clone of it is
	// the same request too.
	t.Run("the same request gets the same key", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		rt := e.client.RoundTripper(e.srv.Client().Transport)
		hc := &http.Client{Transport: rt}
		req := e.paymentRequest(t, 1500, "cus_1")
		tap := idem.ContextWithAction(idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1}), "checkout")
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

		clone := httpReq.Clone(httpReq.Context())
		clone.Body, _ = httpReq.GetBody()
		resp, err = hc.Do(clone)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "a clone is the same request: the stored answer")
	})

	// Most API clients set http.Client.Timeout. Such a client hands the
	// RoundTripper a shallow fork of the caller's request on every Do (net/http
	// forks it to bind the deadline): the same *http.Request, sent again by the
	// API client's own retry, is still the same request and gets the same key.
	t.Run("the same request gets the same key under a client timeout", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		rt := e.client.RoundTripper(e.srv.Client().Transport)
		hc := &http.Client{Transport: rt, Timeout: time.Minute}
		req := e.paymentRequest(t, 1500, "cus_1")
		tap := idem.ContextWithAction(idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1}), "checkout")
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
	})

	// An API client that sets its own Idempotency-Key (as Stripe's SDKs do)
	// and retries with it after an error keeps its promise through the
	// RoundTripper: every attempt carries the caller's key, so the server
	// charges once.
	t.Run("a caller's key is kept across its retries", func(t *testing.T) {
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
	})

	// An API client that puts its own key on the request quoted, as the IETF
	// draft spells it, gets the server's answer: its echo, quoted as received,
	// names the same key.
	t.Run("the echo of a caller's quoted key is taken", func(t *testing.T) {
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
	})

	// A request that carries a stored intent's key is that intent, whether it
	// came through Client.Do or through the RoundTripper: an attempt sent
	// either way keeps a "not found" from being trusted until it can no longer
	// arrive.
	t.Run("a stored intent's key is that intent", func(t *testing.T) {
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
	})
}

// A redirect to a GET is the app's client's to follow: the RoundTripper
// hands it back, and the GET passes with no key and no intent.
func TestRoundTripperRedirect(t *testing.T) {
	t.Parallel()

	t.Run("a marked 303 is paid and the client's GET carries no key", func(t *testing.T) {
		t.Parallel()
		srv, charges, gets := seeOtherServerGETs(t, 1)
		c, err := idem.NewWith(idem.WithClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":300}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "sdk-key-303")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "the client followed the 303")
		assert.JSONEq(t, `{"id":"pay_1"}`, string(body))
		assert.Equal(t, []string{""}, gets(), "the GET carries no key")
		assert.Equal(t, int32(1), charges.Load())
	})

	t.Run("a 302 is handed to the client and the intent stays unknown", func(t *testing.T) {
		t.Parallel()
		var gets atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				gets.Add(1)
				assert.Empty(t, r.Header.Get("Idempotency-Key"), "a GET never carries a key")
				_, _ = io.WriteString(w, "<html>Sign in</html>")
				return
			}
			http.Redirect(w, r, "/login", http.StatusFound)
		}))
		t.Cleanup(srv.Close)
		c, err := idem.NewWith(idem.WithClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 300})
		require.NoError(t, err)
		in, err := c.Intent(context.Background(), "checkout", req)
		require.NoError(t, err)
		httpReq, err := http.NewRequestWithContext(idem.ContextWithIntent(context.Background(), in), http.MethodPost, req.URL, bytes.NewReader(req.Body))
		require.NoError(t, err)
		_, err = hc.Do(httpReq)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the client's follow ends with the call's error")
		var re *idem.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, "/login", re.LastResponse.Header.Get("Location"), "the redirect is in the error")
		assert.Zero(t, gets.Load(), "the login page is not fetched")
		assert.Equal(t, persist.StatePending, in.State(), "neither paid nor failed")

		// A client that stops at redirects gets the 302 itself.
		hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		httpReq, err = http.NewRequestWithContext(idem.ContextWithIntent(context.Background(), in), http.MethodPost, req.URL, bytes.NewReader(req.Body))
		require.NoError(t, err)
		resp, err := hc.Do(httpReq)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusFound, resp.StatusCode)
		assert.Equal(t, "/login", resp.Header.Get("Location"))
		assert.Equal(t, persist.StatePending, in.State())
	})

	// Path, before the fix: a captive portal answers the payment's POST
	// with 302 to its login page. The RoundTripper returned the 302 as a
	// response ("for the app's http.Client to follow"), the app's
	// http.Client followed it with a GET, and hc.Do returned the portal's
	// 200 login page with a nil error: a generated API client read a 200
	// to its payment call, not an error matching ErrOutcomeUnknown.
	t.Run("a portal's 302 never reaches the app as the payment's answer", func(t *testing.T) {
		t.Parallel()
		portal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/login" {
				w.Header().Set("Content-Type", "text/html")
				_, _ = w.Write([]byte("<html><body>Sign in to Airport Wi-Fi</body></html>"))
				return
			}
			http.Redirect(w, r, "/login", http.StatusFound)
		}))
		t.Cleanup(portal.Close)
		c, err := idem.New(idem.Config{Store: persist.NewMemory(nil), Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
		require.NoError(t, err)
		hc := &http.Client{Transport: c.RoundTripper(nil)}
		ctx := idem.ContextWithAction(context.Background(), "checkout:cart-6")
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, portal.URL+"/payments", strings.NewReader(`{"amount":1500,"currency":"AZN"}`))
		require.NoError(t, err)
		r.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(r)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("the payment's call returned %d %q with no error: the captive portal's page, not the server's word", resp.StatusCode, body)
		}
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	})
}

// TestRoundTripperBody keeps the bound on what the RoundTripper reads of
// a request's body.
//
// It runs alone (not parallel), so that the allocations it measures are
// its own.
func TestRoundTripperBody(t *testing.T) {

	t.Run("a streamed body over the limit is refused before sending and never read whole", func(t *testing.T) {
		e := newEnv(t)
		hc := &http.Client{Transport: e.client.RoundTripper(e.srv.Client().Transport)}
		const size = 128 << 20
		for _, tc := range []struct {
			name   string
			length int64
			read   int64 // at most
		}{{"a stream", -1, idem.MaxRequestBodyBytes + 1}, {"a stated length", size, 0}} {
			src := &countingReader{left: size}
			req, err := http.NewRequestWithContext(idem.ContextWithAction(context.Background(), "upload"), http.MethodPost, e.srv.URL+"/payments", src)
			require.NoError(t, err)
			req.ContentLength = tc.length
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = hc.Do(req)
			runtime.ReadMemStats(&after)
			require.ErrorIs(t, err, idem.ErrRequestTooLarge, tc.name)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s of 128 MiB: %d bytes read, %.1f MiB allocated", tc.name, src.read, float64(allocated)/(1<<20))
			assert.LessOrEqual(t, src.read, tc.read, "%s: read to one byte past the limit at most; not at all when its length says so", tc.name)
			assert.Less(t, allocated, uint64(4*idem.MaxRequestBodyBytes), "%s: never buffered whole (128 MiB)", tc.name)
			assert.True(t, src.closed, "%s: the body is closed, as a RoundTripper must", tc.name)
		}
		assert.Zero(t, e.srv.Stats().Requests, "nothing reached the server")
	})

	t.Run("a body at the limit is sent", func(t *testing.T) {
		var got atomic.Int64
		srv := httptest.NewServer(marking(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			got.Store(n)
			w.WriteHeader(http.StatusCreated)
		})))
		t.Cleanup(srv.Close)
		c, err := idem.NewWith(idem.WithClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/upload", io.MultiReader(&countingReader{left: idem.MaxRequestBodyBytes}))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "upload-1")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, int64(idem.MaxRequestBodyBytes), got.Load())
	})
}

// countingReader is a stream of left zero bytes that counts what was read
// of it.
type countingReader struct {
	left, read int64
	closed     bool
}

func (r *countingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.left))
	clear(p[:n])
	r.left -= int64(n)
	r.read += int64(n)
	return n, nil
}

func (r *countingReader) Close() error { r.closed = true; return nil }
