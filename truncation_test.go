package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
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
	lookup, err := srv.Client().Get(srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key()))
	require.NoError(t, err)
	defer lookup.Body.Close()
	body, err := io.ReadAll(lookup.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, lookup.StatusCode)
	assert.JSONEq(t, string(body), string(resp.Body))
}
