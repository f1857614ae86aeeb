package idem_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// TestServer keeps what New accepts of a Server, and what each of its
// fields does to the answers kept.
func TestServer(t *testing.T) {
	t.Parallel()

	// A credential's field name is refused however its words are joined: with
	// an underscore or a dot as well as a hyphen, in any case. Each is a valid
	// field name a server can send, and the device must never keep it.
	t.Run("StoredHeaders refuses a credential's field however it is spelled", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{"X-Api_Key", "X_API_KEY", "api.key", "X-Access_Key", "Private_Key", "x-apikey", "X-SET-COOKIE", "Ocp-Apim-Subscription-Key", "X-Functions-Key",
			"X-Api_Key-Id", "X-Access.Key-Id", "X-Pass_Word"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				c, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{name}}))
				require.Error(t, err, "%q carries a credential", name)
				assert.Nil(t, c)
				assert.Contains(t, err.Error(), "credentials")
			})
		}
		// Names that only look alike are kept.
		for _, name := range []string{"X-Request-Id", "X-Rate-Limit-Remaining", "Etag", "Idempotency-Key", "Public-Key-Pins"} {
			_, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{name}}))
			assert.NoError(t, err, name)
		}
	})

	// Server.StoredHeaders refuses the answer's fields that carry a token under
	// another name than the common ones: a JSON Web Token or an assertion
	// from an identity-aware proxy (Google IAP's X-Goog-Iap-Jwt-Assertion, an
	// AWS load balancer's X-Amzn-Oidc-Data), a bearer token, an access or
	// private key. Fields that only look alike stay allowed.
	t.Run("StoredHeaders refuses a token's field under another name", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{"X-Goog-Iap-Jwt-Assertion", "X-Amzn-Oidc-Data", "X-Bearer", "X-Access-Key", "X-Private-Key", "X-Saml-Assertion"} {
			_, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{name}}))
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), "credentials", name)
		}
		_, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"X-Request-Id", "ETag", "Location", "X-Keyboard-Layout", "X-Payment-Intent"}}))
		assert.NoError(t, err)
	})

	// The largest MaxResponseBytes keeps every answer whole: the bound read is
	// one past what is left of the limit, which must not wrap around to a
	// bound of nothing. What is left is the whole limit for an answer with no
	// header field at all (an HTTP/1.0 server's, recognised by
	// idem.MarkRecognizer): such a final answer, or such an answer of the lookup
	// of a payment whose answer was lost, would settle it succeeded with its
	// receipt empty. An answer with header fields (the lookup subtest's) is
	// read whole too.
	t.Run("MaxResponseBytes at its largest keeps every body", func(t *testing.T) {
		t.Parallel()
		const receipt = `{"id":"pay_1","amount":1500}`
		t.Run("lookup", func(t *testing.T) {
			t.Parallel()
			resp, in := reconcileLostAnswer(t, "checkout:largest",
				idem.WithServer(idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key", MaxResponseBytes: math.MaxInt64}))
			assert.Equal(t, 1500, decodePayment(t, resp.Body).Amount, "the lookup's answer is read whole")
			stored := in.Response()
			require.NotNil(t, stored)
			assert.Equal(t, 1500, decodePayment(t, stored.Body).Amount, "and kept whole")
		})
		t.Run("answer without header fields", func(t *testing.T) {
			t.Parallel()
			addr := headerless(t, func(*http.Request) string { return "HTTP/1.0 201 Created\r\n\r\n" + receipt })
			c, err := idem.NewWith(idem.WithClock(clock.NewManual(epoch)), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}),
				idem.WithServer(idem.Server{MaxResponseBytes: math.MaxInt64, Mark: idem.MarkRecognizer(func(*idem.Response) bool { return true })}))
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: "http://" + addr + "/payments", Body: []byte(`{}`)})
			require.NoError(t, err)
			resp, err := c.Do(context.Background(), in)
			require.NoError(t, err)
			assert.Empty(t, resp.Header, "no header field")
			assert.Equal(t, receipt, string(resp.Body))
			assert.Equal(t, persist.StateSucceeded, in.State())
			assert.Equal(t, receipt, string(in.Response().Body))
		})
		// The lookup's answer with no header field: the bound of its body is
		// the whole limit, the one that would wrap around. Without the echo of
		// the lookup's nonce, a recognised 2xx settles nothing (a cache may
		// have kept another key's lookup), but its body is read whole.
		t.Run("lookup answer without header fields", func(t *testing.T) {
			t.Parallel()
			addr := headerless(t, func(req *http.Request) string {
				if req.Method == http.MethodGet {
					return "HTTP/1.0 200 OK\r\n\r\n" + receipt
				}
				return "" // the send's answer is lost
			})
			c, err := idem.NewWith(idem.WithClock(clock.NewManual(epoch)), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}),
				idem.WithServer(idem.Server{LookupQuery: "idempotency_key", MaxResponseBytes: math.MaxInt64, Mark: idem.MarkRecognizer(func(*idem.Response) bool { return true })}))
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: "http://" + addr + "/payments", Body: []byte(`{}`)})
			require.NoError(t, err)
			_, err = c.Do(context.Background(), in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			resp, err := c.Reconcile(context.Background(), in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.Empty(t, resp.Header, "no header field")
			assert.Equal(t, receipt, string(resp.Body), "the lookup's answer is read whole")
			assert.False(t, in.State().Resolved(), "no echo of the lookup's nonce")
		})
	})

	// LookupQuery names a query parameter; what is not a name (a query
	// written out, a blank, a space or a separator in it) is refused by New,
	// rather than found out when every lookup misses and no intent settles.
	t.Run("LookupQuery must be a parameter name", func(t *testing.T) {
		t.Parallel()
		for _, q := range []string{"idempotency_key=", "?idempotency_key", "idempotency_key=K", "a&b", "key#", "idempotency key", " idempotency_key", "\tk", "k\n"} {
			c, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, LookupQuery: q}))
			require.Error(t, err, "%q", q)
			assert.Nil(t, c)
			assert.Contains(t, err.Error(), "Server.LookupQuery", "%q", q)
		}
		for _, q := range []string{"idempotency_key", "Idempotency-Key", "filter[key]", "k"} {
			_, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, LookupQuery: q}))
			assert.NoError(t, err, q)
		}
	})

	// LookupQuery asks for the intent's own resource: its query as sent, in
	// its order, with its ; and its escapes, and the key appended in the
	// parameter it names, escaped. A parameter of that name already in the
	// URL is replaced, wherever it stood and however it was spelled
	// (idempotency%5Fkey is idempotency_key).
	t.Run("LookupQuery keeps the intent's query as sent", func(t *testing.T) {
		t.Parallel()
		lookups := make(chan string, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				lookups <- r.URL.RawQuery
				http.NotFound(w, r)
				return
			}
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // read, never answered
			}
		}))
		t.Cleanup(srv.Close)
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}),
			idem.WithServer(idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}))
		require.NoError(t, err)
		ctx := context.Background()
		const query = "z=1;y=2&a=%2Fb%20c&idempotency_key=old&m=x+y&idempotency%5Fkey=older&q"
		in, err := c.NewIntent(ctx, "checkout", idem.Request{Method: http.MethodPost, URL: srv.URL + "/payments?" + query + "#frag", Body: []byte(`{}`)})
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		_, _ = c.Reconcile(ctx, in)
		select {
		case got := <-lookups:
			assert.Equal(t, "z=1;y=2&a=%2Fb%20c&m=x+y&q&idempotency_key="+url.QueryEscape(in.Key()), got)
		default:
			t.Fatal("Reconcile asked no lookup")
		}
	})

	t.Run("KeyReusedAnswer takes only an answer that says so for key reuse", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name        string
			status      int
			contentType string
			body        string
			reused      bool
		}{
			{"contract problem", 422, "application/problem+json", `{"type":"https://idem.dev/problems/idempotency-key-reused","status":422}`, true},
			{"stripe", 400, "application/json", `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}`, true},
			{"app's own server", 422, "application/json", `{"code":"DUPLICATE_KEY"}`, true},
			{"validation 422", 422, "application/json", `{"errors":{"amount":["must be positive"]}}`, false},
			{"validation problem", 422, "application/problem+json", `{"type":"https://example.com/problems/validation","status":422}`, false},
			{"bare 422", 422, "text/plain", `Unprocessable`, false},
			{"stripe card error", 402, "application/json", `{"error":{"type":"card_error"}}`, false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					// The server's own answer: an unmarked 4xx settles nothing.
					w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
					w.Header().Set("Content-Type", tc.contentType)
					w.WriteHeader(tc.status)
					_, _ = io.WriteString(w, tc.body)
				}))
				t.Cleanup(srv.Close)
				c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)),
					idem.WithServer(idem.Server{Mark: idem.MarkEcho, KeyReusedAnswer: func(resp *idem.Response) bool {
						return strings.Contains(string(resp.Body), "DUPLICATE_KEY")
					}}))
				require.NoError(t, err)
				req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1})
				require.NoError(t, err)
				in, err := c.NewIntent(context.Background(), "", req)
				require.NoError(t, err)

				resp, err := c.Do(context.Background(), in)
				var apiErr *idem.APIError
				require.ErrorAs(t, err, &apiErr, "a final answer")
				assert.Equal(t, tc.status, resp.StatusCode)
				assert.Equal(t, tc.reused, errors.Is(err, idem.ErrKeyReused))
				if tc.reused {
					assert.Equal(t, persist.StateRejected, in.State())
				} else {
					assert.Equal(t, persist.StateFailed, in.State())
				}
				// The stored answer says the same.
				_, err = c.Do(context.Background(), in)
				assert.Equal(t, tc.reused, errors.Is(err, idem.ErrKeyReused), "from the store")
			})
		}
	})
}

// headerless is the address of a server that reads each request and
// writes answer's text for it raw (an HTTP/1.0 answer with no header
// field, say), or nothing when it is empty, then closes the connection.
func headerless(t *testing.T, answer func(*http.Request) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if req, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(conn, answer(req))
			}
			conn.Close()
		}
	}()
	return ln.Addr().String()
}
