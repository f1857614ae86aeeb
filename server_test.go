package idem_test

import (
	"bufio"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// A credential's field name is refused however its words are joined: with
// an underscore or a dot as well as a hyphen, in any case. Each is a valid
// field name a server can send, and the device must never keep it.
func TestServerStoredHeadersRefusesCredentialsSpelledAnyWay(t *testing.T) {
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
}

// The largest MaxResponseBytes keeps every answer whole: the bound read is
// one past what is left of the limit, which must not wrap around to a
// bound of nothing. What is left is the whole limit for an answer with no
// header field at all (an HTTP/1.0 server's, recognised by
// idem.MarkRecognizer): such a final answer, or such an answer of the lookup
// of a payment whose answer was lost, would settle it succeeded with its
// receipt empty. An answer with header fields (the lookup subtest's) is
// read whole too.
func TestServerMaxResponseBytesAtItsLargestKeepsEveryBody(t *testing.T) {
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

// LookupQuery names a query parameter; what is not a name (a query
// written out, a blank, a space or a separator in it) is refused by New,
// rather than found out when every lookup misses and no intent settles.
func TestServerLookupQueryMustBeAParameterName(t *testing.T) {
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
}

// LookupQuery asks for the intent's own resource: its query as sent, in
// its order, with its ; and its escapes, and the key appended in the
// parameter it names, escaped. A parameter of that name already in the
// URL is replaced, wherever it stood and however it was spelled
// (idempotency%5Fkey is idempotency_key).
func TestServerLookupQueryKeepsTheIntentsQueryAsSent(t *testing.T) {
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
}
