package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/persist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rewritingProxy returns a fake server and a reverse proxy to it that
// passes each answer through modify, as a box in front of a server does.
func rewritingProxy(t *testing.T, modify func(*http.Response) error) (*fakeserver.Server, *httputil.ReverseProxy) {
	t.Helper()
	srv := fakeserver.NewServer(nil)
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ModifyResponse = modify
	return srv, proxy
}

// watchedLookups is an env whose Client has the Authorizer auth, and
// shows seen each lookup (a GET) it sends.
func watchedLookups(t *testing.T, auth func(context.Context, string) (string, error), seen func(*http.Request)) *env {
	t.Helper()
	return newEnv(t, func(c *idem.Config) { c.Authorizer = auth },
		idem.WithHTTPClient(&http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet {
				seen(r)
			}
			return http.DefaultTransport.RoundTrip(r)
		})}))
}

func newCachingProxy(t *testing.T, origin string) *httptest.Server {
	t.Helper()
	u, err := url.Parse(origin)
	require.NoError(t, err)
	p := &cachingProxy{proxy: httputil.NewSingleHostReverseProxy(u), kept: map[string]*httptest.ResponseRecorder{}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv
}

// TestLookup keeps what the lookup's answer may settle.
func TestLookup(t *testing.T) {
	t.Parallel()

	t.Run("a miss a cache kept never voids a charged intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		clk := clock.NewManual(epoch)
		origin := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
		t.Cleanup(origin.Close)
		cdn := newCachingProxy(t, origin.URL)
		net := &heldNetwork{base: cdn.Client().Transport}
		c, err := idem.NewWith(idem.WithClock(clk), idem.WithLookup(contractLookup),
			idem.WithHTTPClient(&http.Client{Transport: net}), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		pay := func(amount int) idem.Request {
			req, err := idem.JSONRequest(http.MethodPost, cdn.URL+"/payments", map[string]any{"amount": amount, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			return req
		}
		in, err := c.Intent(ctx, "checkout", pay(1500))
		require.NoError(t, err)

		net.holdNext(1) // the payment is held in the network
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		_, err = c.Reconcile(ctx, in) // an early lookup: its miss is kept
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the payment may still arrive")
		net.deliver(t)
		require.Equal(t, 1, origin.Stats().ProviderCharges, "the payment arrived and charged")

		clk.Advance(10 * time.Minute) // past the reconcile delay
		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the kept miss, 130 s old, is not the server's word now")
		assert.NotEqual(t, persist.StateVoid, in.State(), "never voided")

		// The next tap, for the changed cart, does not pay again.
		_, err = c.Intent(ctx, "checkout", pay(2500))
		require.ErrorAs(t, err, new(*idem.UnresolvedError))
		assert.Equal(t, 1, origin.Stats().ProviderCharges)
	})

	// A server scopes keys by the caller (docs/CONTRACT.md; fakeserver's
	// "Callers"). Path: the payment is sent with the Authorizer's
	// credentials, and charged under alice; its answer is lost. The lookup,
	// sent without the Authorizer's credentials, would be answered for the
	// anonymous caller, who never used the key: the typed miss, with the
	// nonce. The intent would be voided ("a new payment is safe") though
	// alice was charged.
	t.Run("it acts for the intent's caller, so a stranger's miss never voids a paid intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var lookupAuth atomic.Value
		e := watchedLookups(t, func(context.Context, string) (string, error) { return "Bearer test_alice_1", nil },
			func(r *http.Request) { lookupAuth.Store(r.Header.Get("Authorization")) })
		c, srv := e.client, e.srv
		in, err := c.NewIntent(ctx, "checkout:cart-14", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		_, err = c.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.Equal(t, 1, srv.Stats().ProviderCharges)

		e.clock.Advance(10 * time.Minute) // past the reconcile delay
		_, err = c.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, "Bearer test_alice_1", lookupAuth.Load(), "the lookup carries the Authorizer's credentials")
		assert.Equal(t, persist.StateSucceeded, in.State(), "alice's payment is found")
	})

	t.Run("it carries the stored fields that may name the caller, not the body's", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		clk := clock.NewManual(epoch)
		var got atomic.Value
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				got.Store(r.Header.Clone())
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		t.Cleanup(srv.Close)
		c, err := idem.New(idem.Config{Store: persist.NewMemory(nil), Clock: clk,
			Server:     idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
			Authorizer: func(context.Context, string) (string, error) { return "Bearer fresh", nil }})
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		req.Header.Set("X-Account-Id", "acct_alice")
		req.Header.Set("If-Match", `"v1"`)
		req.Header.Set("Accept-Encoding", "br")
		in, err := c.NewIntent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		h, _ := got.Load().(http.Header)
		require.NotNil(t, h, "the lookup was sent")
		assert.Equal(t, "acct_alice", h.Get("X-Account-Id"), "the caller's account goes with the lookup")
		assert.Equal(t, "Bearer fresh", h.Get("Authorization"))
		assert.Empty(t, h.Get("Content-Type"), "the lookup has no body")
		assert.Empty(t, h.Get("If-Match"), "the intent's precondition is not the lookup's")
		assert.NotEqual(t, "br", h.Get("Accept-Encoding"), "left to net/http, which decodes the answer")
		assert.Empty(t, h.Get("Idempotency-Key"), "never a key on GET")
	})

	t.Run("an Authorizer that fails ends it unknown, with nothing sent or changed", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var lookups atomic.Int32
		var fail atomic.Bool
		refresh := errors.New("token refresh failed")
		e := watchedLookups(t, func(context.Context, string) (string, error) {
			if fail.Load() {
				return "", refresh
			}
			return "Bearer test_alice_1", nil
		}, func(*http.Request) { lookups.Add(1) })
		c, srv := e.client, e.srv
		in, err := c.NewIntent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		_, err = c.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		e.clock.Advance(10 * time.Minute)
		fail.Store(true)
		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.ErrorIs(t, err, refresh, "the Authorizer's failure is told")
		assert.Zero(t, lookups.Load(), "nothing is sent")
		assert.Equal(t, persist.StatePending, in.State(), "nothing changes")

		fail.Store(false)
		_, err = c.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, in.State())
	})

	// The lookup's answers that are the server's word settle the intent: a 2xx
	// that echoes the key, a 404 of the typed miss; an app whose server cannot
	// mark them recognises its own with idem.MarkRecognizer, and its
	// recognised answers echo the lookup's nonce. An answer made for another
	// lookup (another key's, another nonce's) settles nothing.
	t.Run("the server's word settles the intent", func(t *testing.T) {
		t.Parallel()
		recognised := idem.WithServer(idem.Server{Lookup: contractLookup, Mark: idem.MarkRecognizer(func(resp *idem.Response) bool { return resp.Header.Get("X-Served-By") == "payments" })})
		cases := []struct {
			name   string
			answer func(w http.ResponseWriter, r *http.Request)
			opts   []idem.Option
			state  persist.State
		}{
			{"200 with the echo", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Idempotency-Key", r.URL.Query().Get("idempotency_key"))
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, nil, persist.StateSucceeded},
			{"200 with a quoted echo", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Idempotency-Key", `"`+r.URL.Query().Get("idempotency_key")+`"`)
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, nil, persist.StateSucceeded},
			{"200 echoing another key", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Idempotency-Key", "another-key")
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, nil, persist.StateExpired},
			{"typed miss without the echo", writeKeyUnused, nil, persist.StateVoid},
			{"recognised 200", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Served-By", "payments")
				w.Header().Set(idempotency.LookupNonceHeader, r.Header.Get(idempotency.LookupNonceHeader))
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, []idem.Option{recognised}, persist.StateSucceeded},
			// A recognizer reads no key: without this lookup's nonce, the 200
			// may be another key's lookup that a cache kept.
			{"recognised 200 without the lookup's nonce", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Served-By", "payments")
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, []idem.Option{recognised}, persist.StateExpired},
			{"recognised 200 with the nonce from a cache", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Served-By", "payments")
				w.Header().Set(idempotency.LookupNonceHeader, r.Header.Get(idempotency.LookupNonceHeader))
				w.Header().Set("Age", "30")
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, []idem.Option{recognised}, persist.StateExpired},
			{"200 echoing the key and another lookup's nonce", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Idempotency-Key", r.URL.Query().Get("idempotency_key"))
				w.Header().Set(idempotency.LookupNonceHeader, "ANOTHERLOOKUPSNONCE")
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, nil, persist.StateExpired},
			{"200 echoing the key from a cache", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Idempotency-Key", r.URL.Query().Get("idempotency_key"))
				w.Header().Set("Age", "30")
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, nil, persist.StateSucceeded},
			{"recognised 200 echoing another key", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Served-By", "payments")
				w.Header().Set("Idempotency-Key", "another-key")
				w.Header().Set(idempotency.LookupNonceHeader, r.Header.Get(idempotency.LookupNonceHeader))
				strangerPage(w, http.StatusOK, "application/json", `{"id":"pay_1"}`)
			}, []idem.Option{recognised}, persist.StateExpired},
			{"recognised 404", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Served-By", "payments")
				w.Header().Set(idempotency.LookupNonceHeader, r.Header.Get(idempotency.LookupNonceHeader))
				strangerPage(w, http.StatusNotFound, "application/json", `{"error":"not found"}`)
			}, []idem.Option{recognised}, persist.StateVoid},
			{"recognised 404 without the lookup's nonce", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Served-By", "payments")
				strangerPage(w, http.StatusNotFound, "application/json", `{"error":"not found"}`)
			}, []idem.Option{recognised}, persist.StateExpired},
			{"unrecognised 404 with a recogniser", func(w http.ResponseWriter, _ *http.Request) {
				strangerPage(w, http.StatusNotFound, "text/html", "<html>Not Found</html>")
			}, []idem.Option{recognised}, persist.StateExpired},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
					switch {
					case r.Method == http.MethodPost:
						w.WriteHeader(http.StatusServiceUnavailable)
					case isLookup(r):
						tc.answer(w, r)
					default:
						return false
					}
					return true
				})
				c := f.client(t, append([]idem.Option{idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1})}, tc.opts...)...)
				in, err := c.Intent(ctx, "checkout", f.payment(t, 1500))
				require.NoError(t, err)
				_, err = c.Do(ctx, in)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				f.clock.Advance(sendWindow)
				_, _ = c.Settle(ctx, in)
				assert.Equal(t, tc.state, in.State())
			})
		}

		// Path: the lookup's miss is trusted only when it echoes the lookup's
		// nonce (a cache may have kept it), and so is a 2xx that only a
		// recognizer that reads no key vouches for: under MarkJSONID any 2xx
		// JSON with an id would settle the intent succeeded. A CDN with a
		// "cache everything, ignore the query string" rule (the server is a
		// plain one: the echo is dropped here to make it so) keeps the
		// lookup's answer for intent X, GET /payments?idempotency_key=X, and
		// serves it to the lookup of intent Y, GET
		// /payments?idempotency_key=Y. Y, which the server never saw (its one
		// attempt got a proxy's 503), would be settled succeeded, with X's
		// payment as its receipt.
		t.Run("a cached lookup of another key never settles", func(t *testing.T) {
			t.Parallel()
			srv, proxy := rewritingProxy(t, func(resp *http.Response) error {
				resp.Header.Del("Idempotency-Key") // a plain server: no echo
				return nil
			})
			type cached struct {
				status int
				header http.Header
				body   []byte
			}
			var cache sync.Map // path (the query ignored) -> *cached
			cdn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					if v, ok := cache.Load(r.URL.Path); ok {
						c := v.(*cached)
						for k, v := range c.header {
							w.Header()[k] = v
						}
						w.WriteHeader(c.status)
						_, _ = w.Write(c.body)
						return
					}
				}
				rec := httptest.NewRecorder()
				proxy.ServeHTTP(rec, r)
				res := rec.Result()
				body, _ := io.ReadAll(res.Body)
				if r.Method == http.MethodGet && res.StatusCode == http.StatusOK {
					cache.Store(r.URL.Path, &cached{res.StatusCode, res.Header.Clone(), body})
				}
				for k, v := range res.Header {
					w.Header()[k] = v
				}
				w.WriteHeader(res.StatusCode)
				_, _ = w.Write(body)
			}))
			defer cdn.Close()
			ctx := context.Background()
			c, err := idem.New(idem.Config{Store: persist.NewMemory(nil), Server: idem.Server{Mark: idem.MarkJSONID("id"), LookupQuery: "idempotency_key"}})
			require.NoError(t, err)
			// X is paid, and someone (another device, a support tool) looks it
			// up through the CDN.
			reqX, _ := idem.JSONRequest(http.MethodPost, cdn.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			inX, err := c.NewIntent(ctx, "checkout:cart-x", reqX)
			require.NoError(t, err)
			_, err = c.Do(ctx, inX)
			require.NoError(t, err, "setup: X")
			lr, err := http.Get(cdn.URL + "/payments?idempotency_key=" + url.QueryEscape(inX.Key()))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, lr.Body)
			lr.Body.Close()
			require.Equal(t, http.StatusOK, lr.StatusCode, "setup: X's lookup is cached")
			// Y: one attempt, a proxy's 503; the server never sees it.
			reqY, _ := idem.JSONRequest(http.MethodPost, cdn.URL+"/payments", map[string]any{"amount": 9900, "currency": "AZN", "customer": "cus_2"})
			inY, err := c.NewIntent(ctx, "checkout:cart-y", reqY)
			require.NoError(t, err)
			require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 503, Path: "/payments"}))
			_, err = c.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), inY)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "setup: Y")
			_, err = c.Reconcile(ctx, inY)
			require.Equal(t, 1, srv.Stats().ProviderCharges, "setup: Y never charged")
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.False(t, inY.State().Resolved(), "Y's lookup got X's cached answer")
		})
	})

	// A lookup that gets no answer takes at most MaxElapsed, though the
	// http.Client has no Timeout; the intent stays as it was.
	t.Run("it is bounded by MaxElapsed", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c, in := stalling(t, noAnswer)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			_, err := c.Reconcile(ctx, in)
			took := time.Since(start)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "the budget ended the lookup, not the caller's context")
			assert.Equal(t, 200*time.Millisecond, took, "the budget")
			assert.Equal(t, persist.StateNew, in.State())
		})
	})

	// A call's own retry policy bounds its lookup too, not only the Client's:
	// a Send under a 300ms budget does not wait the Client's minutes on a
	// lookup that hangs.
	t.Run("it takes the call's retry policy", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			c, in := stalling(t, noAnswer, idem.WithRetryPolicy(idem.RetryPolicy{MaxElapsed: time.Hour}))

			ctx, cancel := context.WithTimeout(idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxElapsed: 300 * time.Millisecond}), 15*time.Second)
			defer cancel()
			start := time.Now()
			_, err := c.Reconcile(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "the call's budget ended the lookup, not the caller's context")
			assert.Equal(t, 300*time.Millisecond, time.Since(start), "the call's budget is 300ms, the Client's an hour")
		})
	})

	// The lookup asks caches on the path to go to the server: a "not found"
	// kept from before the payment must not void it.
	t.Run("it asks caches to ask the server", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var cacheControl atomic.Value
		f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
			if isLookup(r) {
				cacheControl.Store(r.Header.Get("Cache-Control"))
			}
			return false
		})
		c := f.client(t)
		in, err := c.Intent(ctx, "checkout", f.payment(t, 1500))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, in))
		_, err = c.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, "no-cache", cacheControl.Load())
		assert.Equal(t, persist.StateVoid, in.State())
	})

	// A lookup redirected to a login page (the app's session ended) says
	// nothing about the payment: the page's 200 must not make the intent
	// succeeded, nor be stored as its answer.
	t.Run("a redirected page is never taken for the payment", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodPost:
				w.WriteHeader(http.StatusServiceUnavailable)
			case r.URL.Path == "/login":
				w.Header().Set("Content-Type", "text/html")
				io.WriteString(w, "<html>Sign in</html>")
			default:
				http.Redirect(w, r, "/login", http.StatusFound)
			}
		}))
		t.Cleanup(srv.Close)
		clk := clock.NewManual(epoch)
		c, err := idem.NewWith(idem.WithClock(clk), idem.WithLookup(contractLookup), idem.WithHTTPClient(srv.Client()), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		clk.Advance(reconcileDelay)

		resp, err := c.Reconcile(ctx, in)
		require.Error(t, err)
		assert.False(t, in.State().Resolved(), "a login page settles nothing")
		assert.Nil(t, in.Response())
		if resp != nil {
			assert.Equal(t, http.StatusFound, resp.StatusCode, "the redirect itself is the answer")
		}
	})

	// A fallback page on the lookup is never taken for the payment: the POST
	// never reached the server (a gateway answered 503), and a CDN answers the
	// lookup with its own page, a single-page app's index.html say. The intent
	// is not succeeded; once the server answers its typed miss, the intent is
	// void and the user pays, once.
	t.Run("a fallback page is never taken for the payment", func(t *testing.T) {
		t.Parallel()
		for _, stranger := range lookupStrangers {
			t.Run(stranger.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				var inFront atomic.Bool
				inFront.Store(true)
				f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
					switch {
					case r.Method == http.MethodPost && inFront.Load():
						w.WriteHeader(http.StatusServiceUnavailable)
						return true
					case isLookup(r) && inFront.Load():
						stranger.answer(w, r)
						return true
					}
					return false
				})
				c := f.client(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
				req := f.payment(t, 1500)
				in, err := c.Intent(ctx, "checkout", req)
				require.NoError(t, err)
				_, err = c.Do(ctx, in)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

				f.clock.Advance(sendWindow)
				resp, err := c.Send(ctx, "checkout", req)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the stranger's answer cannot tell")
				require.NotNil(t, resp, "the stranger's answer is returned for the app to see")
				stored, err := c.Load(ctx, in.Key())
				require.NoError(t, err)
				assert.Equal(t, persist.StateExpired, stored.State(), "not succeeded: nothing changes")
				assert.Nil(t, stored.Response(), "no stranger's page is stored as the intent's answer")
				assert.Zero(t, f.origin.Stats().Payments)

				inFront.Store(false)
				resp, err = c.Send(ctx, "checkout", req)
				require.NoError(t, err)
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				stored, err = c.Load(ctx, in.Key())
				require.NoError(t, err)
				assert.Equal(t, persist.StateVoid, stored.State(), "the server's typed miss voids it")
				assert.Equal(t, 1, f.origin.Stats().Payments, "paid once")
			})
		}
	})

	// A lookup's answer is stored like a final answer: only the header fields
	// a replay and the app need, no cookies or tokens.
	t.Run("it stores only the needed header fields", func(t *testing.T) {
		t.Parallel()
		store := persist.NewMemory(nil)
		c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Set-Cookie", "session=secret-cookie")
			w.Write([]byte(`{"id":"pay_1"}`))
		}, idem.WithStore(store))
		ctx := context.Background()
		in, err := c.NewIntent(ctx, "", req)
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, in))
		resp, err := c.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, "session=secret-cookie", resp.Header.Get("Set-Cookie"), "the call's own Response has every field")
		rec, err := store.Get(ctx, in.Key())
		require.NoError(t, err)
		require.NotNil(t, rec.Response)
		assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, rec.Response.Header)
	})

	// A lookup's 2xx larger than Server.MaxResponseBytes settles the intent
	// from its status, as a send's final answer does, without its body: the
	// server has done the work, and asking again gets the same answer, so
	// leaving the outcome unknown would leave it unknown for ever.
	t.Run("an answer over the limit settles the intent without its body", func(t *testing.T) {
		t.Parallel()
		c, req := answering(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/payments/pay_1")
			w.Write([]byte(`{"id":"pay_1","pad":"` + strings.Repeat("x", 4096) + `"}`))
		}, idem.WithMaxResponseBytes(1024))
		ctx := context.Background()
		in, err := c.NewIntent(ctx, "", req)
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, in))

		resp, err := c.Reconcile(ctx, in)
		require.NoError(t, err)
		require.NotNil(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.True(t, resp.Oversized)
		assert.Nil(t, resp.Body)
		assert.Equal(t, persist.StateSucceeded, in.State())
		stored := in.Response()
		require.NotNil(t, stored)
		assert.True(t, stored.Oversized)
		assert.Equal(t, "/payments/pay_1", stored.Header.Get("Location"))
	})
}

// cachingProxy is a reverse proxy in front of the server with a CDN's
// "cache everything" rule: the first answer to each GET is kept, whatever
// its Cache-Control, and served again to every later GET of the URL, with
// its age (Age: 130), header fields and all.
type cachingProxy struct {
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	kept  map[string]*httptest.ResponseRecorder
	hits  atomic.Int32
}

func (p *cachingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		p.proxy.ServeHTTP(w, r)
		return
	}
	p.mu.Lock()
	kept, ok := p.kept[r.URL.String()]
	p.mu.Unlock()
	if !ok {
		rec := httptest.NewRecorder()
		p.proxy.ServeHTTP(rec, r)
		p.mu.Lock()
		p.kept[r.URL.String()] = rec
		p.mu.Unlock()
		kept = rec
	} else {
		p.hits.Add(1)
		w.Header().Set("Age", "130")
	}
	for k, v := range kept.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(kept.Code)
	_, _ = w.Write(kept.Body.Bytes())
}

func TestLookupQuery(t *testing.T) {
	t.Parallel()
	lookup := idem.LookupQuery("idempotency_key")
	for _, tc := range []struct{ url, key, want string }{
		{"https://api.example/payments", "k1", "https://api.example/payments?idempotency_key=k1"},
		{"https://api.example/payments?idempotency_key=old&v=2#frag", "a b&c", "https://api.example/payments?v=2&idempotency_key=a+b%26c"},
	} {
		assert.Equal(t, tc.want, lookup(idem.Request{Method: http.MethodPost, URL: tc.url}, tc.key))
	}
}
