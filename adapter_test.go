package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/clocktest"
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
	s := &redirectingServer{h: fakeserver.NewHandler(&fakeserver.Options{Clock: clocktest.New(epoch)})}
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
			c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clocktest.New(epoch)))
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "", req)
			require.NoError(t, err)

			resp, err := c.Do(context.Background(), in)
			var apiErr *idem.APIError
			require.ErrorAs(t, err, &apiErr, "a %d is not a success", code)
			assert.Equal(t, code, resp.StatusCode, "the 3xx itself is the answer")
			assert.Equal(t, "/login", resp.Header.Get("Location"))
			assert.NotEqual(t, persist.StateSucceeded, in.State())
			require.NotNil(t, in.Response())
			assert.Equal(t, code, in.Response().StatusCode, "the login page is not stored as the payment's answer")
			seen := srv.requests()
			require.Len(t, seen, 1, "the GET is not made")
			assert.Equal(t, http.MethodPost, seen[0].method)
		})
	}
}

func TestA307Or308KeepsMethodKeyAndBody(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			srv := newRedirectingServer(t, map[string]func(http.ResponseWriter, *http.Request){
				"POST /v1/payments": redirectTo(code, "/payments"),
			})
			c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clocktest.New(epoch)), idem.WithQuotedKey())
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
}

// answering is a test server that answers every request with h, and a
// Client that sends to it on a manual clock.
func answering(t *testing.T, h http.HandlerFunc, opts ...idem.Option) (*idem.Client, idem.Request) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	base := []idem.Option{idem.WithHTTPClient(srv.Client()), idem.WithClock(clocktest.New(epoch))}
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
