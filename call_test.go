package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/persist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// answering is a test server that answers every request with h, and a
// Client that sends to it on a manual clock.
//
// The server marks its answers as the contract asks (see marking).
func answering(t *testing.T, h http.HandlerFunc, opts ...idem.Option) (*idem.Client, idem.Request) {
	t.Helper()
	srv := httptest.NewServer(marking(h))
	t.Cleanup(srv.Close)
	base := []idem.Option{idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)), idem.WithLookup(contractLookup)}
	c, err := idem.NewWith(append(base, opts...)...)
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
	c, err := idem.NewWith(
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
	assert.Equal(t, persist.StateSucceeded, in.State())
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
	lookup, err := srv.Client().Get(lookupOf(srv.URL+"/payments", in.Key()))
	require.NoError(t, err)
	defer lookup.Body.Close()
	body, err := io.ReadAll(lookup.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, lookup.StatusCode)
	assert.JSONEq(t, string(body), string(resp.Body))
}

// An attempt cut short by the caller's cancel is counted, and the attempt
// hook hears of it like any other.
func TestTheAttemptHookHearsOfAnAttemptCutShortByCancellation(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })
	var mu sync.Mutex
	var heard []idem.Attempt
	c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)),
		idem.WithAttemptHook(func(a idem.Attempt) { mu.Lock(); heard = append(heard, a); mu.Unlock() }))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	_, err = c.Do(ctx, in)
	var re *idem.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Attempts)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, heard, 1, "the counted attempt is reported")
	assert.Equal(t, 1, heard[0].Number)
	assert.Error(t, heard[0].Err)
}

// A captive portal's 200 whose header fields alone pass the Client's limit
// on an answer (a long Set-Cookie, a content security policy) is as much a
// stranger's as any unmarked 200: over the limit or not, it is not a
// payment, and the intent stays pending.
func TestAnUnmarkedSuccessOverTheLimitIsNotAPayment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Set-Cookie", "portal="+strings.Repeat("x", 2048))
		strangerPage(w, http.StatusOK, "text/html", "<html>log in</html>")
		return true
	})
	c := f.client(t, idem.WithServer(idem.Server{LookupQuery: "idempotency_key", MaxResponseBytes: 1024}))
	in, err := c.Intent(ctx, "checkout", f.payment(t, 1500))
	require.NoError(t, err)
	_, err = c.Do(ctx, in)
	requireStop(t, err, idem.StopUnmarked)
	assert.Equal(t, persist.StatePending, in.State())
}
