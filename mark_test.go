package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// plainServer is a payment server that keeps a record per key but marks
// nothing: no echo of the key, no Idempotent-Replayed. It answers a POST
// of /payments 201 with the payment's JSON, its id included, and a key it
// has seen with the same answer. Its lookup (GET /payments?idempotency_key=K)
// answers the payment, or a plain 404. In front of it, stranger answers
// the requests it wants to (a captive portal, a CDN, a gateway), or
// returns false to pass them on; after reports a request the server
// answered, and may drop its answer by returning true.
type plainServer struct {
	srv      *httptest.Server
	mu       sync.Mutex
	payments map[string]string // key: the answer's body
	charges  atomic.Int32
}

func newPlainServer(t *testing.T, stranger func(w http.ResponseWriter, r *http.Request) bool) *plainServer {
	t.Helper()
	s := &plainServer{payments: map[string]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stranger != nil && stranger(w, r) {
			return
		}
		s.serve(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *plainServer) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/payments":
		key := r.Header.Get("Idempotency-Key")
		body, ok := s.payments[key]
		if !ok {
			body = fmt.Sprintf(`{"id":"pay_%d","amount":1500,"status":"succeeded"}`, s.charges.Add(1))
			s.payments[key] = body
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, body)
	case r.Method == http.MethodGet && r.URL.Path == "/payments":
		body, ok := s.payments[r.URL.Query().Get("idempotency_key")]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"not found"}`)
			return
		}
		_, _ = io.WriteString(w, body)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// client is a Client of the plain server, declared with the JSON id
// recognizer, and t's intent that pays at it.
func (s *plainServer) client(t *testing.T, opts ...Option) (*Client, *Intent) {
	t.Helper()
	base := []Option{
		WithHTTPClient(s.srv.Client()), WithClock(clock.NewManual(retryAfterNow)),
		WithServer(Server{Mark: MarkJSONID("id"), LookupQuery: "idempotency_key"}),
		WithRetryPolicy(RetryPolicy{Jitter: -1}),
	}
	c, err := NewWith(append(base, opts...)...)
	require.NoError(t, err)
	return c, newPayment(t, c, s.srv.URL)
}

// loseFirstAnswer passes every request to base, and loses the answer of
// the first: the server did the work, the device never heard of it.
type loseFirstAnswer struct {
	base http.RoundTripper
	lost atomic.Bool
}

func (l *loseFirstAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(req)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, errors.New("connection reset by peer")
	}
	return resp, err
}

// reflectingGateway is an API gateway in front of a fakeserver. It proxies
// every request, except that it answers the n-th request (from 1) itself
// when answer says so, with the request's header fields copied into its
// answer, as some gateways' error templates and mocking layers do.
func reflectingGateway(t *testing.T, backend string, answer func(n int, w http.ResponseWriter) bool) *httptest.Server {
	t.Helper()
	u, _ := url.Parse(backend)
	proxy := httputil.NewSingleHostReverseProxy(u)
	var n atomic.Int32
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m := int(n.Add(1)); answer != nil {
			for k, vs := range r.Header {
				if k == "Content-Length" || k == "Content-Type" || k == "Accept-Encoding" {
					continue
				}
				for _, v := range vs {
					w.Header().Add(k, v)
				}
			}
			if answer(m, w) {
				return
			}
			for k := range r.Header {
				w.Header().Del(k)
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(gw.Close)
	return gw
}

func TestMark(t *testing.T) {
	t.Parallel()
	t.Run("MarkJSONID: an answer a cache kept for another intent never settles a send", markJSONIDBehindACachingCDN)
	ctx := context.Background()

	// Path: attempt 1 reaches the server, which charges and commits, but
	// the answer is lost (FaultDropResponse; the gateway answers 502,
	// retried). Attempt 2 is answered by the gateway itself, 401 "token
	// expired", with the request's header fields copied into its answer,
	// the Idempotency-Key among them. Taken for the server's echo, the 401
	// would settle the intent failed, though the card was charged: the
	// app lets the user pay again with a new intent, a second charge.
	t.Run("a gateway's 401 that copies the request's key never settles as failed", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewServer(nil)
		defer srv.Close()
		gw := reflectingGateway(t, srv.URL, func(n int, w http.ResponseWriter) bool {
			if n < 2 {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"message":"Unauthorized"}`))
			return true
		})
		c, err := New(Config{Store: persist.NewMemory(nil), Server: Server{Mark: MarkEcho, LookupQuery: "idempotency_key"},
			RetryPolicy: RetryPolicy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}})
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		req, _ := JSONRequest(http.MethodPost, gw.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		in, err := c.NewIntent(ctx, "checkout:cart-1", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.Equal(t, 1, srv.Stats().ProviderCharges, "setup: charged once")
		var retryErr *RetryError
		require.ErrorAs(t, err, &retryErr)
		assert.Equal(t, StopUnmarked, retryErr.Reason)
		assert.False(t, in.State().Resolved(), "the gateway's 401 carrying a copied Idempotency-Key is not the server's word")
	})

	// Path: the first attempt is answered by a gateway in maintenance mode
	// with its own 200 HTML page, the request's header fields copied into
	// it (Idempotency-Key among them); the server never sees the request.
	// Taken for the server's echo, the page would settle the intent
	// succeeded: the app ships the order, and nothing was paid.
	t.Run("a gateway's 200 page that copies the request's key never settles as paid", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewServer(nil)
		defer srv.Close()
		gw := reflectingGateway(t, srv.URL, func(_ int, w http.ResponseWriter) bool {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte(`<html><body>We'll be back soon</body></html>`))
			return true
		})
		c, err := New(Config{Store: persist.NewMemory(nil), Server: Server{Mark: MarkEcho, LookupQuery: "idempotency_key"}})
		require.NoError(t, err)
		req, _ := JSONRequest(http.MethodPost, gw.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		in, err := c.NewIntent(ctx, "checkout:cart-2", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.Zero(t, srv.Stats().Requests, "setup: the server saw nothing")
		var retryErr *RetryError
		require.ErrorAs(t, err, &retryErr)
		assert.Equal(t, StopUnmarked, retryErr.Reason)
		assert.NotEqual(t, persist.StateSucceeded, in.State(), "the gateway's page is no payment")
	})

	t.Run("a plain server's 201 carrying the resource's id is paid", func(t *testing.T) {
		t.Parallel()
		s := newPlainServer(t, nil)
		c, in := s.client(t)
		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, int32(1), s.charges.Load())
	})

	t.Run("a plain server's answer to the retry after a lost answer is paid once", func(t *testing.T) {
		t.Parallel()
		s := newPlainServer(t, nil)
		c, in := s.client(t, WithHTTPClient(&http.Client{Transport: &loseFirstAnswer{base: s.srv.Client().Transport}}))
		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, 2, resp.Attempts)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, int32(1), s.charges.Load(), "the retry got the server's record")
	})

	// What answers instead of the server: each ends outcome unknown, the
	// intent unresolved, and nothing reached the server.
	for _, tc := range []struct {
		name     string
		stranger func(w http.ResponseWriter, r *http.Request) bool
	}{
		{"a captive portal's 200 page never settles", func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, `<html><body><form action="/portal/accept">Accept the terms to use the Wi-Fi</form></body></html>`)
			return true
		}},
		{"a 302 to a login page never settles", func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/login" {
				w.Header().Set("Content-Type", "text/html")
				_, _ = io.WriteString(w, `<html><body>Sign in</body></html>`)
				return true
			}
			http.Redirect(w, r, "/login", http.StatusFound)
			return true
		}},
		{"a CDN's fallback index.html never settles", func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Type", "text/html")
			w.Header().Set("Cache-Control", "public, max-age=300")
			_, _ = io.WriteString(w, `<!doctype html><html><head><script src="/assets/index-3f2a.js"></script></head><body><div id="root"></div></body></html>`)
			return true
		}},
		{"a 200 JSON without the resource's id never settles", func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"status":"ok","message":"maintenance: try again later"}`)
			return true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newPlainServer(t, tc.stranger)
			c, in := s.client(t)
			_, err := c.Do(ctx, in)
			require.ErrorIs(t, err, ErrOutcomeUnknown)
			assert.False(t, in.State().Resolved(), "not paid, not failed")
			assert.Zero(t, s.charges.Load())
		})
	}

	// A gateway's 401 to the retry of an attempt whose answer was lost
	// says nothing about that attempt, which charged: JSON with an id in
	// it or not, a 4xx is never recognised by the JSON id recognizer.
	t.Run("an unmarked 4xx after a lost answer never settles", func(t *testing.T) {
		t.Parallel()
		var (
			gateway atomic.Bool
			posts   atomic.Int32
		)
		gateway.Store(true)
		s := newPlainServer(t, func(w http.ResponseWriter, r *http.Request) bool {
			// The first attempt goes through, later ones meet the
			// gateway while it is there.
			if r.Method != http.MethodPost || posts.Add(1) == 1 || !gateway.Load() {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"id":"req_77","error":"session expired"}`)
			return true
		})
		c, in := s.client(t, WithHTTPClient(&http.Client{Transport: &loseFirstAnswer{base: s.srv.Client().Transport}}))
		_, err := c.Do(ctx, in)
		require.ErrorIs(t, err, ErrOutcomeUnknown)
		var retryErr *RetryError
		require.ErrorAs(t, err, &retryErr)
		assert.Equal(t, StopUnmarked, retryErr.Reason)
		assert.Contains(t, err.Error(), "Config.Server.Mark", "the error points at the declared mark")
		assert.False(t, in.State().Resolved(), "the 401 is not the payment's answer")
		assert.Equal(t, int32(1), s.charges.Load())

		// Once the gateway lets the retry through, the server's record
		// settles it: paid once.
		gateway.Store(false)
		resp, err := c.Settle(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, int32(1), s.charges.Load())
	})

	// New refuses a Server without a mark, naming the setting and every
	// choice; each preset and a recognizer are accepted.
	t.Run("New refuses a Server without one, naming every choice", func(t *testing.T) {
		t.Parallel()
		_, err := New(Config{})
		require.Error(t, err)
		for _, w := range []string{"Config.Server.Mark is not set", "idem.MarkEcho", "idem.MarkStripe", "idem.MarkAdyen", "idem.MarkIncrease", `idem.MarkJSONID("id")`, "idem.MarkRecognizer"} {
			assert.Contains(t, err.Error(), w)
		}
		for _, m := range []Mark{MarkEcho, MarkStripe, MarkAdyen, MarkIncrease, MarkJSONID("id"), MarkJSONID("data.id"), MarkRecognizer(func(*Response) bool { return false })} {
			_, err := New(Config{Server: Server{Mark: m}})
			assert.NoError(t, err, m.String())
		}
	})
}

func TestMarkJSONID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		path   string
		status int
		ct     string
		body   string
		want   bool
	}{
		{"a 201 JSON object with a string id", "id", 201, "application/json", `{"id":"pay_1","amount":1500}`, true},
		{"a 200 with a number id", "id", 200, "application/json; charset=utf-8", `{"id":42}`, true},
		{"a +json type", "id", 201, "application/vnd.api+json", `{"id":"pay_1"}`, true},
		{"a nested id", "data.id", 201, "application/json", `{"data":{"id":"pay_1"}}`, true},
		{"a 4xx carrying an id", "id", 400, "application/json", `{"id":"err_1","error":"bad"}`, false},
		{"a 401 carrying an id", "id", 401, "application/json", `{"id":"req_1"}`, false},
		{"a 409 carrying an id", "id", 409, "application/json", `{"id":"pay_1"}`, false},
		{"a 3xx carrying an id", "id", 303, "application/json", `{"id":"pay_1"}`, false},
		{"an empty id", "id", 201, "application/json", `{"id":" "}`, false},
		{"a null id", "id", 201, "application/json", `{"id":null}`, false},
		{"an object for an id", "id", 201, "application/json", `{"id":{}}`, false},
		{"no id", "id", 201, "application/json", `{"amount":1500}`, false},
		{"the id elsewhere than the path", "data.id", 201, "application/json", `{"id":"pay_1"}`, false},
		{"a JSON array", "id", 200, "application/json", `[{"id":"pay_1"}]`, false},
		{"JSON served as HTML", "id", 200, "text/html", `{"id":"pay_1"}`, false},
		{"JSON served as text", "id", 200, "text/plain", `{"id":"pay_1"}`, false},
		{"no Content-Type", "id", 200, "", `{"id":"pay_1"}`, false},
		{"an HTML page", "id", 200, "text/html", `<html id="pay_1"></html>`, false},
		{"an empty body", "id", 204, "application/json", ``, false},
		{"a body not kept (over the limit)", "id", 201, "application/json", "", false},
		{"a body cut off", "id", 201, "application/json", `{"id":"pay_1"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := MarkJSONID(tc.path)
			require.NoError(t, m.check())
			h := http.Header{}
			if tc.ct != "" {
				h.Set("Content-Type", tc.ct)
			}
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			assert.Equal(t, tc.want, m.own(&Response{StatusCode: tc.status, Header: h, Body: body}, "k"))
		})
	}
	// Each 2xx the test above recognises, with each other status: the
	// status alone never decides, and no other status is recognised.
	for code := 100; code < 600; code++ {
		resp := &Response{StatusCode: code, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}
		assert.Equal(t, isSuccess(code), MarkJSONID("id").own(resp, "k"), "status %d", code)
	}
}

func TestMarkIncrease(t *testing.T) {
	t.Parallel()
	const key = "8c1f3a52-6f4e-4a7e-9d0b-2f61c1f0a8e3"
	object := func(k string) string {
		return `{"id":"ach_transfer_uoxatyh3lt5evrsdvo7q","type":"ach_transfer","amount":100,"idempotency_key":` + k + `,"status":"pending_approval"}`
	}
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   bool
	}{
		{"the object created under the key", 200, object(`"` + key + `"`), true},
		{"a list found by the key", 200, `{"data":[` + object(`"`+key+`"`) + `],"next_cursor":null}`, true},
		{"the object created under another key", 200, object(`"another"`), false},
		{"an object created without a key", 200, object(`null`), false},
		{"an empty list", 200, `{"data":[],"next_cursor":null}`, false},
		{"a list of another key's object", 200, `{"data":[` + object(`"another"`) + `],"next_cursor":null}`, false},
		{"an error carrying the key", 409, `{"status":409,"type":"idempotency_key_already_used_error","resource_id":"ach_transfer_1","idempotency_key":"` + key + `"}`, false},
		{"the key without an id", 200, `{"idempotency_key":"` + key + `"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp := &Response{StatusCode: tc.status, Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}}, Body: []byte(tc.body)}
			assert.Equal(t, tc.want, MarkIncrease.own(resp, key))
		})
	}
	t.Run("the object served as HTML", func(t *testing.T) {
		t.Parallel()
		resp := &Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/html"}}, Body: []byte(object(`"` + key + `"`))}
		assert.False(t, MarkIncrease.own(resp, key))
	})

	// Increase over the wire: its first answer carries no mark in its
	// header fields, its replay says Idempotent-Replayed: true.
	t.Run("Increase's first answer and its replay are paid", func(t *testing.T) {
		t.Parallel()
		var (
			mu      sync.Mutex
			created = map[string]string{}
		)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			defer mu.Unlock()
			k := r.Header.Get("Idempotency-Key")
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			body, ok := created[k]
			if ok {
				w.Header().Set("Idempotent-Replayed", "true")
			} else {
				body = strings.Replace(object(`"`+k+`"`), "uoxatyh3lt5evrsdvo7q", fmt.Sprint(len(created)), 1)
				created[k] = body
			}
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		c, err := NewWith(WithHTTPClient(&http.Client{Transport: &loseFirstAnswer{base: srv.Client().Transport}}),
			WithClock(clock.NewManual(retryAfterNow)), WithServer(Server{Mark: MarkIncrease}), WithRetryPolicy(RetryPolicy{Jitter: -1}))
		require.NoError(t, err)
		in := newPayment(t, c, srv.URL)
		resp, err := c.Do(context.Background(), in)
		require.NoError(t, err)
		assert.True(t, resp.Replayed, "the first answer was lost, the replay is marked")

		in = newPayment(t, c, srv.URL)
		resp, err = c.Do(context.Background(), in)
		require.NoError(t, err, "the first answer is recognised by its body")
		assert.False(t, resp.Replayed)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Len(t, created, 2)
	})

	// Path: Increase marks only its replays (Idempotent-Replayed: true)
	// and echoes no key; its objects carry the key in idempotency_key
	// (emulated here by a proxy in front of fakeserver that drops the echo
	// and writes the key into the body). A CDN in front caches POST
	// answers by path (a misconfigured cache rule). Intent X's retry gets
	// the server's replay, which the cache keeps; intent Y, another
	// payment to the same URL, gets that replay from the cache. Were the
	// replay header the mark, Y would be settled succeeded with X's
	// payment as its answer, and the server never saw Y.
	t.Run("a cached replay of another intent never settles", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewServer(nil)
		defer srv.Close()
		u, _ := url.Parse(srv.URL)
		proxy := httputil.NewSingleHostReverseProxy(u)
		proxy.ModifyResponse = func(resp *http.Response) error {
			resp.Header.Del("Idempotency-Key") // Increase echoes no key
			var obj map[string]any
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if json.Unmarshal(b, &obj) == nil && obj["id"] != nil {
				obj["idempotency_key"] = resp.Request.Header.Get("Idempotency-Key")
				b, _ = json.Marshal(obj)
			}
			resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			resp.Header.Set("Content-Length", fmt.Sprint(len(b)))
			return nil
		}
		type cached struct {
			status int
			header http.Header
			body   []byte
		}
		var cache atomic.Pointer[cached]
		cdn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c := cache.Load(); c != nil {
				for k, v := range c.header {
					w.Header()[k] = v
				}
				w.Header().Set("Age", "3")
				w.WriteHeader(c.status)
				_, _ = w.Write(c.body)
				return
			}
			rec := httptest.NewRecorder()
			proxy.ServeHTTP(rec, r)
			res := rec.Result()
			body, _ := io.ReadAll(res.Body)
			if res.Header.Get("Idempotent-Replayed") == "true" {
				cache.Store(&cached{res.StatusCode, res.Header.Clone(), body})
			}
			for k, v := range res.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(res.StatusCode)
			_, _ = w.Write(body)
		}))
		defer cdn.Close()
		c, err := New(Config{Store: persist.NewMemory(nil), Server: Server{Mark: MarkIncrease, LookupQuery: "idempotency_key"},
			RetryPolicy: RetryPolicy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}})
		require.NoError(t, err)
		ctx := context.Background()
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		reqX, _ := JSONRequest(http.MethodPost, cdn.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		resp, err := c.Send(ctx, "checkout:cart-x", reqX)
		require.NoError(t, err, "setup: X's replay carries its key in the body")
		require.True(t, resp.Replayed, "setup: X was settled by the replay")
		require.NotNil(t, cache.Load(), "setup: the CDN kept X's replay")

		reqY, _ := JSONRequest(http.MethodPost, cdn.URL+"/payments", map[string]any{"amount": 9900, "currency": "AZN", "customer": "cus_2"})
		in, err := c.NewIntent(ctx, "checkout:cart-y", reqY)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.Equal(t, 1, srv.Stats().ProviderCharges, "setup: Y never reached the server")
		var retryErr *RetryError
		require.ErrorAs(t, err, &retryErr, "Y is told X's answer")
		assert.Equal(t, StopUnmarked, retryErr.Reason)
		assert.False(t, in.State().Resolved(), "Y never reached the server")
	})
}

// markJSONIDBehindACachingCDN holds a path a red-team pass found, which had
// charged twice or told the app a false outcome.
//
// Path: a cache in front of the API (a "cache everything" rule on the
// CDN) keeps the 201 that paid cart 1 and serves it, with an Age field as
// RFC 9111 asks, to the POST that pays cart 2, another intent with another
// key. MarkJSONID recognises any 2xx JSON with an id: the send path
// (trustedAnswer) does not look at Age, though the lookup path refuses an
// answer with an Age to a recognizer that reads no key, for just this
// reason (lookupTrusted). Cart 2 is stored succeeded
// with cart 1's payment id; it was never charged.
func markJSONIDBehindACachingCDN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var charges atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d","object":"payment"}`, n)
	}))
	t.Cleanup(api.Close)
	target, err := url.Parse(api.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	var kept *httptest.ResponseRecorder
	cdn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if kept == nil {
			rec := httptest.NewRecorder()
			proxy.ServeHTTP(rec, r)
			kept = rec
		} else {
			w.Header().Set("Age", "7")
		}
		for k, vs := range kept.Header() {
			w.Header()[k] = vs
		}
		w.WriteHeader(kept.Code)
		_, _ = w.Write(kept.Body.Bytes())
	}))
	t.Cleanup(cdn.Close)

	fs, err := persist.OpenDir(filepath.Join(t.TempDir(), "idem"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { fs.Close() })
	c, err := New(Config{Store: fs, HTTPClient: cdn.Client(), Server: Server{Mark: MarkJSONID("id")}})
	require.NoError(t, err)
	cart := func(amount int) Request {
		req, err := JSONRequest(http.MethodPost, cdn.URL+"/payments", map[string]any{"amount": amount, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		return req
	}
	_, err = c.Send(ctx, "checkout:cart-1", cart(1500))
	require.NoError(t, err)
	resp, err := c.Send(ctx, "checkout:cart-2", cart(2500))
	if resp != nil {
		t.Logf("cart 2: %d %s (Age %q)", resp.StatusCode, resp.Body, resp.Header.Get("Age"))
	}
	assert.ErrorIs(t, err, ErrOutcomeUnknown, "a kept answer to another intent is not the server's word on this one")
	assert.Equal(t, int32(1), charges.Load(), "cart 2 was never charged")
	pending, err := c.Unresolved(ctx)
	require.NoError(t, err)
	assert.Len(t, pending, 1, "cart 2 reads paid, and is not settled again")
}
