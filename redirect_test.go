package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/persist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestRedirect keeps what a redirect answer to a payment means: a 303 the
// server marked is its word that the work was done; every other redirect
// leaves the outcome unknown; none is "failed".
func TestRedirect(t *testing.T) {
	t.Parallel()

	// Path: a captive portal (or a misrouted ingress) answers the payment's
	// POST with 307 to its own JSON API on another host; idem's
	// http.Client follows it (redirectPolicy follows a 307 that keeps the
	// method, to any host), and the portal's 200 application/json
	// {"id": "sess_..."} would be read by MarkJSONID as the payment
	// server's created resource. The server never saw the request.
	t.Run("a stranger's JSON after a redirect to another origin never settles", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewServer(nil)
		defer srv.Close()
		portalAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"sess_8f2c","status":"login_required","login_url":"http://portal.example/login"}`))
		}))
		defer portalAPI.Close()
		portal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, portalAPI.URL+"/api/v1/sessions", http.StatusTemporaryRedirect)
		}))
		defer portal.Close()
		for _, mark := range []idem.Mark{idem.MarkJSONID("id"), idem.MarkRecognizer(func(*idem.Response) bool { return true })} {
			c, err := idem.New(idem.Config{Store: persist.NewMemory(nil), Server: idem.Server{Mark: mark, LookupQuery: "idempotency_key"}})
			require.NoError(t, err)
			req, _ := idem.JSONRequest(http.MethodPost, portal.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			in, err := c.NewIntent(context.Background(), "checkout:cart-7", req)
			require.NoError(t, err)
			_, err = c.Do(context.Background(), in)
			requireStop(t, err, idem.StopUnmarked)
			assert.False(t, in.State().Resolved(), "%v: the portal's JSON answer settled the intent", mark)
		}
	})

	t.Run("a replayed 303 after a lost first answer ends paid", func(t *testing.T) {
		t.Parallel()
		srv, charges := seeOtherServer(t, 1)
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		in, err := c.Intent(context.Background(), "checkout", req)
		require.NoError(t, err)

		resp, err := c.Do(context.Background(), in)
		require.NoError(t, err, "the server's word that the payment was made")
		assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
		assert.True(t, resp.Replayed, "the retry got the stored 303")
		assert.Equal(t, "/payments/pay_1", resp.Header.Get("Location"), "Location names the result")
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, int32(1), charges.Load())

		again, err := c.Do(context.Background(), in)
		require.NoError(t, err, "the stored outcome is paid too")
		assert.True(t, again.FromStore)
		assert.Equal(t, http.StatusSeeOther, again.StatusCode)
	})

	t.Run("a fresh 303 that echoes the key ends paid", func(t *testing.T) {
		t.Parallel()
		srv, charges := seeOtherServer(t, 0)
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)
		resp, err := c.Do(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
		assert.False(t, resp.Replayed)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, int32(1), charges.Load())
	})

	for _, code := range []int{http.StatusMultipleChoices, http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		for _, mark := range []string{"Idempotent-Replayed", "Idempotency-Key"} {
			t.Run(fmt.Sprintf("a %d marked by %s is never failed", code, mark), func(t *testing.T) {
				t.Parallel()
				srv := newRedirectingServer(t, map[string]func(http.ResponseWriter, *http.Request){
					"POST /payments": func(w http.ResponseWriter, r *http.Request) {
						if mark == "Idempotency-Key" {
							w.Header().Set(mark, r.Header.Get(mark))
						} else {
							w.Header().Set(mark, "true")
						}
						// No Location: net/http hands even a 307 or 308
						// back unfollowed.
						w.WriteHeader(code)
					},
				})
				c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)))
				require.NoError(t, err)
				req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
				require.NoError(t, err)
				in, err := c.NewIntent(context.Background(), "", req)
				require.NoError(t, err)
				_, err = c.Do(context.Background(), in)
				requireStop(t, err, idem.StopRedirect, "neither paid nor failed")
				assert.NotErrorAs(t, err, new(*idem.APIError))
				assert.False(t, in.State().Resolved(), "reconciled later, never stored failed")
				assert.Len(t, srv.requests(), 1, "asking again would get the same redirect")
			})
		}
	}

	// A 303 after a POST is followed with a GET, and a GET never carries the
	// key (contract section 8).
	t.Run("a 303 is followed with a GET that carries no key", func(t *testing.T) {
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
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/old/payments", map[string]any{"amount": 1, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)
		_, _ = c.Do(context.Background(), in)
		mu.Lock()
		defer mu.Unlock()
		assert.Empty(t, getKeys, "a redirect that turns the POST into a GET is not followed, so no GET carries the key")
	})

	t.Run("a redirected GET is never the outcome", func(t *testing.T) {
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
				c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)))
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
	})

	t.Run("a redirect after an attempt that charged leaves the outcome unknown", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
		t.Cleanup(srv.Close)
		// The first attempt charges and its answer is lost; a login page in
		// front of the server answers the second with a redirect.
		hc := &http.Client{Transport: &loginAfterFirst{base: srv.Client().Transport}}
		c, err := idem.NewWith(idem.WithHTTPClient(hc), idem.WithClock(clk))
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
	})

	t.Run("a 307 or 308 keeps the method, the key and the body", func(t *testing.T) {
		t.Parallel()
		for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
			t.Run(http.StatusText(code), func(t *testing.T) {
				t.Parallel()
				srv := newRedirectingServer(t, map[string]func(http.ResponseWriter, *http.Request){
					"POST /v1/payments": redirectTo(code, "/payments"),
				})
				c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)), idem.WithQuotedKey())
				require.NoError(t, err)
				req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/v1/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
				require.NoError(t, err)
				in, err := c.NewIntent(context.Background(), "", req)
				require.NoError(t, err)

				resp, err := c.Do(context.Background(), in)
				require.NoError(t, err)
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, persist.StateSucceeded, in.State())
				seen := srv.requests()
				require.Len(t, seen, 2)
				for _, r := range seen {
					assert.Equal(t, http.MethodPost, r.method)
					assert.Equal(t, `"`+in.Key()+`"`, r.key, "the key as spelled on the first request")
					assert.Equal(t, string(req.Body), r.body)
				}
			})
		}
	})

	// Here a 307. The payment's body and headers never leave TLS, and the
	// outcome is unknown, as for any redirect not followed.
	t.Run("a redirect from https to http is not followed", func(t *testing.T) {
		t.Parallel()
		var plain atomic.Int32
		insecure := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			plain.Add(1)
			w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(insecure.Close)
		secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, insecure.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}))
		t.Cleanup(secure.Close)
		c, err := idem.NewWith(idem.WithHTTPClient(secure.Client()), idem.WithClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, secure.URL+"/payments", map[string]any{"amount": 1, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)
		_, err = c.Do(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		var re *idem.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, idem.StopRedirect, re.Reason)
		assert.Zero(t, plain.Load(), "nothing was sent over plain http")
	})

	// An edge in front of the server redirects the first POST to another URL
	// of the same server (another query), where it is charged
	// and its answer lost. The retry goes to the intent's own URL, whose
	// fingerprint differs, and the server answers 422 key reused, marked as
	// its own. That answer says nothing of the work: the payment was made, and
	// the intent is settled by the lookup, not reported rejected.
	t.Run("a key reuse answer after a redirect to another URL leaves the outcome unknown", func(t *testing.T) {
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
				c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk), idem.WithLookup(contractLookup),
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
				assert.Equal(t, persist.StatePending, in.State())

				changed, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 2500, "currency": "AZN", "customer": "cus_1"})
				require.NoError(t, err)
				_, err = c.Intent(context.Background(), "checkout", changed)
				require.ErrorAs(t, err, new(*idem.UnresolvedError), "the user cannot pay again while the first payment may be made")

				clk.Advance(5 * time.Minute) // past the reconcile delay
				resp, err := c.Settle(context.Background(), in)
				require.NoError(t, err, "the lookup is the server's word")
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, persist.StateSucceeded, in.State())
			})
		}
	})

	// The redirect is remembered with the intent: after a restart, the retry's
	// key reuse answer still leaves the outcome unknown, and the lookup
	// settles it.
	t.Run("a redirect to another URL is remembered across a restart", func(t *testing.T) {
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
			c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clk), idem.WithStore(store), idem.WithLookup(contractLookup),
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
		assert.Equal(t, persist.StateSucceeded, settled[0].Intent.State(), "not rejected: the payment was made")
		assert.Equal(t, int32(3), posts.Load(), "the first POST, the redirected one, and one retry to the intent's own URL")
	})

	// The request changed under its key, a bug in the caller. A redirect to
	// the same URL does not change that.
	t.Run("a key reuse answer without a redirect to another URL is final", func(t *testing.T) {
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
		assert.Equal(t, persist.StateRejected, in.State())
		assert.Equal(t, int32(2), posts.Load())
	})
}

// seeOtherServer is a payment API behind the idempotency middleware that
// answers a created payment with 303 See Other to /payments/pay_1, as
// some APIs do, and serves that page to a GET. It drops its first drops
// answers after the work, as a lost connection would, and counts its
// charges.
func seeOtherServer(t *testing.T, drops int32) (*httptest.Server, *atomic.Int32) {
	srv, charges, _ := seeOtherServerGETs(t, drops)
	return srv, charges
}

// seeOtherServerGETs is seeOtherServer that also returns the
// Idempotency-Key of each GET of the payment's page.
func seeOtherServerGETs(t *testing.T, drops int32) (*httptest.Server, *atomic.Int32, func() []string) {
	t.Helper()
	var charges, dropped atomic.Int32
	var mu sync.Mutex
	var gets []string
	api := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		http.Redirect(w, r, "/payments/pay_1", http.StatusSeeOther)
	}), idempotency.Config{Store: &idempotency.MemoryStore{}, Principal: func(*http.Request) string { return "" }})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/payments/pay_1" {
			mu.Lock()
			gets = append(gets, r.Header.Get("Idempotency-Key"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"pay_1"}`)
			return
		}
		if r.Method == http.MethodPost && dropped.Add(1) <= drops {
			api.ServeHTTP(httptest.NewRecorder(), r)
			panic(http.ErrAbortHandler) // the answer is lost
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &charges, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), gets...)
	}
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
