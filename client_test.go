package idem_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/persist"
)

var epoch = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

// The Client's defaults: the server's retention less the safety margin is
// how long an intent may be sent, and a lookup's "not found" is trusted
// once no attempt can still arrive, reconcileDelay after the last.
const (
	sendWindow     = 24*time.Hour - time.Hour
	reconcileDelay = 2 * time.Minute
)

// requireStop asserts that err is a *RetryError that reason ended.
func requireStop(t testing.TB, err error, reason idem.StopReason, msgAndArgs ...any) {
	t.Helper()
	var re *idem.RetryError
	require.ErrorAs(t, err, &re, msgAndArgs...)
	require.Equal(t, reason, re.Reason, msgAndArgs...)
}

// contractLookup is the contract's lookup by key,
// GET /payments?idempotency_key=K, the one way the tests ask the server
// about a key, given to their clients with idem.WithLookup.
var contractLookup = idem.LookupQuery("idempotency_key")

// lookupOf is the lookup of key for an intent that POSTs to rawURL.
func lookupOf(rawURL, key string) string {
	return contractLookup(idem.Request{URL: rawURL}, key)
}

// env is one fake server and one client that share a manual clock: a client
// that waits two seconds makes two seconds pass for the server's leases too.
type env struct {
	srv    *fakeserver.Server
	clock  *clock.Manual
	store  persist.Store
	client *idem.Client
}

func newEnv(t testing.TB, opts ...idem.Option) *env {
	t.Helper()
	return newEnvAt(t, epoch, opts...)
}

// newEnvAt is newEnv with the manual clock set to start.
func newEnvAt(t testing.TB, start time.Time, opts ...idem.Option) *env {
	t.Helper()
	clk := clock.NewManual(start)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	e := &env{srv: srv, clock: clk, store: persist.NewMemory(nil)}
	e.client = e.newClient(t, opts...)
	return e
}

// newClient is a fresh Client on the env's store and clock, as after a
// restart of the app.
func (e *env) newClient(t testing.TB, opts ...idem.Option) *idem.Client {
	t.Helper()
	base := []idem.Option{
		idem.WithHTTPClient(e.srv.Client()),
		idem.WithStore(e.store),
		idem.WithClock(e.clock),
		idem.WithLookup(contractLookup),
	}
	c, err := idem.NewWith(append(base, opts...)...)
	require.NoError(t, err)
	return c
}

type payment struct {
	ID       string `json:"id"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
	Status   string `json:"status"`
}

func (e *env) paymentRequest(t testing.TB, amount int, customer string) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, e.srv.URL+"/payments", map[string]any{
		"amount": amount, "currency": "AZN", "customer": customer, "description": "cart",
	})
	require.NoError(t, err)
	return req
}

// newIntent returns an intent for name that the user has tapped: armed
// (saved) and not sent yet.
func (e *env) newIntent(t testing.TB, name string, amount int) *idem.Intent {
	t.Helper()
	in, err := e.client.NewIntent(context.Background(), name, e.paymentRequest(t, amount, "cus_1"))
	require.NoError(t, err)
	// Tapped: armed, as its first Do would, and not sent yet.
	require.NoError(t, idem.Arm(e.client, context.Background(), in))
	return in
}

func (e *env) fault(t testing.TB, f fakeserver.Fault) {
	t.Helper()
	require.NoError(t, e.srv.InjectFault(f))
}

func decodePayment(t testing.TB, body []byte) payment {
	t.Helper()
	var p payment
	require.NoError(t, json.Unmarshal(body, &p), "body %s", body)
	return p
}

func (e *env) lookup(t testing.TB, key string) payment {
	t.Helper()
	resp, err := e.srv.Client().Get(lookupOf(e.srv.URL+"/payments", key))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var p payment
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	return p
}

// countingHandler counts slog records.
type countingHandler struct {
	mu *sync.Mutex
	n  *int
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h countingHandler) Handle(context.Context, slog.Record) error {
	h.mu.Lock()
	*h.n++
	h.mu.Unlock()
	return nil
}

func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h countingHandler) WithGroup(string) slog.Handler { return h }

// TestLogger keeps what the app's logger hears: idem's records, and no
// other library's.
func TestLogger(t *testing.T) {
	t.Parallel()

	t.Run("it gets the records", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		n := 0
		e := newEnv(t, idem.WithLogger(slog.New(countingHandler{&mu, &n})))
		in := e.newIntent(t, "checkout:log", 100)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable})
		_, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		// idem's own records: one per attempt, and the outcome.
		assert.GreaterOrEqual(t, n, 3)
	})

	// The app's logger gets idem's lines and no other: none of the retry library's
	// own (its "request failed" at ERROR level for an answer idem retries, its
	// count of remaining retries).
	t.Run("it hears only idem", func(t *testing.T) {
		t.Parallel()
		var (
			mu   sync.Mutex
			recs []string
		)
		e := newEnv(t, idem.WithLogger(slog.New(recordingHandler{&mu, &recs})))
		in := e.newIntent(t, "checkout:log-only-idem", 100)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: http.StatusServiceUnavailable})
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
		_, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, recs)
		for _, r := range recs {
			assert.Contains(t, r, " idem: ", "a line the app did not ask for: %s", r)
			assert.NotContains(t, r, "remaining", "a line the app did not ask for: %s", r)
			assert.False(t, strings.HasPrefix(r, "ERROR"), "an error line for an answer idem retried: %s", r)
		}
	})
}

// recordingHandler keeps every slog record's level, message and attributes.
type recordingHandler struct {
	mu   *sync.Mutex
	recs *[]string
}

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordingHandler) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	h.mu.Lock()
	*h.recs = append(*h.recs, line)
	h.mu.Unlock()
	return nil
}

func (h recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h recordingHandler) WithGroup(string) slog.Handler { return h }

// gatedServer is the real fake server behind a gate that holds every
// POST /payments until released, and writes down each one's key as it
// arrives: a way to act while an attempt is on the wire, without sleeping.
type gatedServer struct {
	h       *fakeserver.Handler
	url     string
	client  *http.Client
	clock   *clock.Manual
	arrived chan string // the Idempotency-Key of each POST /payments
	release chan struct{}
	once    sync.Once
}

func newGatedServer(t *testing.T) *gatedServer {
	t.Helper()
	clk := clock.NewManual(epoch)
	g := &gatedServer{
		h:       fakeserver.NewHandler(&fakeserver.Options{Clock: clk}),
		clock:   clk,
		arrived: make(chan string, 16),
		release: make(chan struct{}),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/payments" {
			g.arrived <- r.Header.Get("Idempotency-Key")
			<-g.release
		}
		g.h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(g.open) // runs before srv.Close: no handler stays blocked
	g.url, g.client = srv.URL, srv.Client()
	return g
}

func (g *gatedServer) open() { g.once.Do(func() { close(g.release) }) }

func (g *gatedServer) newClient(t *testing.T, opts ...idem.Option) *idem.Client {
	t.Helper()
	c, err := idem.NewWith(append([]idem.Option{idem.WithHTTPClient(g.client), idem.WithClock(g.clock), idem.WithLookup(contractLookup)}, opts...)...)
	require.NoError(t, err)
	return c
}

func (g *gatedServer) payment(t *testing.T, amount int) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, g.url+"/payments", map[string]any{"amount": amount, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	return req
}

// TestQuotedKey keeps WithQuotedKey: the key goes on the wire as an
// sf-string and stays the same key.
func TestQuotedKey(t *testing.T) {
	t.Parallel()

	// WithQuotedKey puts the key on the wire as an sf-string.
	t.Run("it is quoted on the wire", func(t *testing.T) {
		t.Parallel()
		g := newGatedServer(t)
		g.open()
		for _, quoted := range []bool{false, true} {
			var opts []idem.Option
			if quoted {
				opts = append(opts, idem.WithQuotedKey())
			}
			c := g.newClient(t, opts...)
			in, err := c.NewIntent(context.Background(), "", g.payment(t, 100))
			require.NoError(t, err)
			_, err = c.Do(context.Background(), in)
			require.NoError(t, err)
			want := in.Key()
			if quoted {
				want = `"` + in.Key() + `"`
			}
			assert.Equal(t, want, <-g.arrived)
		}
	})

	t.Run("it is the same key", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithQuotedKey())
		in := e.newIntent(t, "checkout:quoted", 1500)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
		resp, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)
		assert.True(t, resp.Replayed, "the quoted key found the bare key's record")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
		assert.NotEmpty(t, e.lookup(t, in.Key()).ID, "the server filed the payment under the bare key")
	})
}

// marking wraps a test server's handler so that it marks its answers as
// the contract's servers do: the request's Idempotency-Key echoed on every
// answer to a keyed request, the lookup's key (its idempotency_key query
// parameter) on every lookup answer. A handler may still set its own.
func marking(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Values("Idempotency-Key"); len(k) > 0 {
			w.Header()["Idempotency-Key"] = k
		} else if q := r.URL.Query(); q.Has("idempotency_key") {
			w.Header().Set("Idempotency-Key", q.Get("idempotency_key"))
		}
		h.ServeHTTP(w, r)
	})
}

// writeKeyUnused answers the lookup r's typed miss, with r's nonce echoed
// as the server does: nothing was done under the key.
func writeKeyUnused(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(idempotency.LookupNonceHeader, r.Header.Get(idempotency.LookupNonceHeader))
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte(`{"type":"https://idem.dev/problems/idempotency-key-unused","title":"Idempotency-Key unused","status":404}`))
}

// front is the fake server behind something on the path that answers some
// requests itself (a gateway, a CDN, a captive portal): stranger is asked
// first and answers, or returns false to pass the request on.
type front struct {
	origin *fakeserver.Handler
	srv    *httptest.Server
	clock  *clock.Manual
	store  persist.Store
}

func newFront(t testing.TB, stranger func(w http.ResponseWriter, r *http.Request) bool) *front {
	t.Helper()
	clk := clock.NewManual(epoch)
	f := &front{origin: fakeserver.NewHandler(&fakeserver.Options{Clock: clk}), clock: clk, store: persist.NewMemory(nil)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !stranger(w, r) {
			f.origin.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *front) client(t testing.TB, opts ...idem.Option) *idem.Client {
	t.Helper()
	base := []idem.Option{idem.WithHTTPClient(f.srv.Client()), idem.WithStore(f.store), idem.WithClock(f.clock), idem.WithLookup(contractLookup)}
	c, err := idem.NewWith(append(base, opts...)...)
	require.NoError(t, err)
	return c
}

func (f *front) payment(t testing.TB, amount int) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, f.srv.URL+"/payments", map[string]any{
		"amount": amount, "currency": "AZN", "customer": "cus_1", "description": "cart",
	})
	require.NoError(t, err)
	return req
}

// strangerPage answers as something in front of the server does: its own
// status and page, no key echoed.
func strangerPage(w http.ResponseWriter, status int, contentType, body string) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
