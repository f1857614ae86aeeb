package idempotency_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/jsonbody"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counter is a handler whose effect adds to a counter through OnCommit.
type counter struct {
	status      int
	nothingDone bool // the handler calls NothingDone
	effects     atomic.Int32
	runs        atomic.Int32
	block       chan struct{} // if not nil, the handler waits on it
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.runs.Add(1)
	if c.block != nil {
		<-c.block
	}
	if c.nothingDone {
		idempotency.NothingDone(r.Context())
	}
	_ = idempotency.OnCommit(r.Context(), func(context.Context) error { c.effects.Add(1); return nil })
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(c.status)
	_, _ = w.Write([]byte("done"))
}

// anyone is the Principal of tests with one caller.
func anyone(*http.Request) string { return "" }

func serve(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.HeaderKey, key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestCommitHook(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		status      int
		nothingDone bool
		effects     int32
		stored      bool
	}{
		{"success commits the effect with the record", 201, false, 1, true},
		{"business outcome is stored", 402, false, 1, true},
		{"server error discards both", 500, true, 0, false},
		{"503 discards both", 503, true, 0, false},
		{"server error keeps the record for a takeover", 500, false, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &idempotency.MemoryStore{}
			c := &counter{status: tt.status, nothingDone: tt.nothingDone}
			m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store})
			first := serve(m, "k", "x")
			assert.Equal(t, tt.status, first.Code)
			assert.Equal(t, tt.effects, c.effects.Load())
			records, inProgress, _ := store.Count(context.Background())
			if !tt.stored && !tt.nothingDone {
				// The handler may have called a provider: the record
				// stays, its lease ended, and the retry takes it over.
				assert.Equal(t, 1, inProgress)
				assert.Equal(t, tt.status, serve(m, "k", "x").Code, "taken over at once")
				assert.Equal(t, int32(2), c.runs.Load())
				return
			}
			assert.Zero(t, inProgress)
			if !tt.stored {
				assert.Zero(t, records)
				return
			}
			assert.Equal(t, 1, records)
			again := serve(m, "k", "x")
			assert.Equal(t, tt.status, again.Code)
			assert.Equal(t, "done", again.Body.String())
			assert.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
			assert.Empty(t, again.Header().Get("X-Not-Stored"), "only what a replay needs is stored")
			assert.Equal(t, int32(1), c.runs.Load())
		})
	}
}

func TestOnCommitWithoutMiddlewareRunsAtOnce(t *testing.T) {
	t.Parallel()
	c := &counter{status: 201}
	serve(c, "", "")
	assert.Equal(t, int32(1), c.effects.Load())
}

// TestInProgressRetryAfterNeverPassesTheLease: work expected to take longer
// than the lease answers a resend's 409 with the time left on the lease,
// when the record may be taken over, not the time the work was expected
// to take.
func TestInProgressRetryAfterNeverPassesTheLease(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(t0)
	slow := &counter{status: 201, block: make(chan struct{})}
	m := idempotency.New(slow, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}, Clock: clk,
		Lease: 30 * time.Second, Expected: 60 * time.Second})
	var wg sync.WaitGroup
	wg.Go(func() { serve(m, "k", "x") })
	require.Eventually(t, func() bool { return slow.runs.Load() == 1 }, 10*time.Second, time.Millisecond)

	clk.Advance(25 * time.Second)
	again := serve(m, "k", "x")
	assert.Equal(t, http.StatusConflict, again.Code)
	assert.Equal(t, "5", again.Header().Get("Retry-After"), "the lease ends in 5 s")
	close(slow.block)
	wg.Wait()
}

func TestLostLeaseDiscardsEffect(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(t0)
	store := &idempotency.MemoryStore{}
	slow := &counter{status: 201, block: make(chan struct{})}
	slowM := idempotency.New(slow, idempotency.Config{Principal: anyone, Store: store, Clock: clk, Lease: time.Second})
	var wg sync.WaitGroup
	var first *httptest.ResponseRecorder
	wg.Go(func() { first = serve(slowM, "k", "x") })
	require.Eventually(t, func() bool { return slow.runs.Load() == 1 }, 10*time.Second, time.Millisecond)

	clk.Advance(time.Second)
	fast := &counter{status: 201}
	second := serve(idempotency.New(fast, idempotency.Config{Principal: anyone, Store: store, Clock: clk, Lease: time.Second}), "k", "x")
	assert.Equal(t, 201, second.Code, "the expired lease was taken over")

	close(slow.block)
	wg.Wait()
	assert.Equal(t, http.StatusConflict, first.Code, "the first worker lost its record")
	assert.Equal(t, "1", first.Header().Get("Retry-After"))
	assert.Zero(t, slow.effects.Load(), "its effect was discarded")
	assert.Equal(t, int32(1), fast.effects.Load())
}

func TestTakeoverSeesStableID(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(t0)
	store := &idempotency.MemoryStore{}
	var infos []idempotency.Info
	var mu sync.Mutex
	crash := true
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := idempotency.FromContext(r.Context())
		require.True(t, ok)
		mu.Lock()
		infos = append(infos, info)
		c := crash
		crash = false
		mu.Unlock()
		if c {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(201)
	})
	m := idempotency.New(h, idempotency.Config{Principal: anyone, Store: store, Clock: clk})
	assert.PanicsWithValue(t, http.ErrAbortHandler, func() { serve(m, "k", "x") })
	clk.Advance(idempotency.DefaultLease)
	assert.Equal(t, 201, serve(m, "k", "x").Code)
	require.Len(t, infos, 2)
	assert.False(t, infos[0].Takeover)
	assert.True(t, infos[1].Takeover)
	assert.Equal(t, infos[0].StableID, infos[1].StableID)
}

// TestJSONWithoutOneReadingIsRefusedBeforeTheStore: a body whose member
// names collide after case folding, or that nests past Config.MaxDepth, is
// a 400 before the key is looked at: the handler does not run, nothing is
// stored, and a record the key already has is left alone.
func TestJSONWithoutOneReadingIsRefusedBeforeTheStore(t *testing.T) {
	t.Parallel()
	store := &idempotency.MemoryStore{}
	c := &counter{status: 201}
	m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, MaxDepth: 3})
	for _, body := range []string{`{"amount":1500,"AMOUNT":2000}`, `{"a":[[[1]]]}`} {
		w := serve(m, "fresh", body)
		assert.Equal(t, http.StatusBadRequest, w.Code, body)
		assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
		assert.Contains(t, w.Body.String(), idempotency.TypeBadRequest)
	}
	require.Equal(t, 201, serve(m, "used", `{"amount":1500}`).Code)
	w := serve(m, "used", `{"amount":1500,"Amount":1500}`)
	assert.Equal(t, http.StatusBadRequest, w.Code, "refused even when the key has a record")
	assert.Equal(t, int32(1), c.runs.Load())
	records, _, _ := store.Count(context.Background())
	assert.Equal(t, 1, records)
	assert.Equal(t, 201, serve(m, "fresh", `{"a":[[1]]}`).Code, "the key stays free; three levels are allowed")
}

// TestStoreFullIsRetryableAndStoresNothing: a store with no room answers a
// new key 503 (an unknown outcome a client retries) with the time until a
// record expires as Retry-After; the handler does not run and the key stays
// unused, so the retry after that time does the work once.
func TestStoreFullIsRetryableAndStoresNothing(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(t0)
	store := &idempotency.MemoryStore{MaxRecords: 1}
	c := &counter{status: 201}
	m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, Clock: clk, Retention: time.Hour})
	require.Equal(t, 201, serve(m, "a", "x").Code)

	clk.Advance(time.Minute)
	w := serve(m, "b", "x")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Contains(t, w.Body.String(), idempotency.TypeStorageFull)
	assert.Equal(t, "3540", w.Header().Get("Retry-After"), "59 minutes until the record of a expires")
	assert.Equal(t, int32(1), c.runs.Load(), "the handler did not run")
	assert.Equal(t, "true", serve(m, "a", "x").Header().Get(idempotency.HeaderReplayed), "held keys still replay")

	clk.Advance(59 * time.Minute)
	assert.Equal(t, 201, serve(m, "b", "x").Code)
	assert.Equal(t, int32(2), c.runs.Load())
	assert.Equal(t, int32(2), c.effects.Load())
}

// provider is an external payment provider with its own idempotency on the
// server's stable id, as the package docs ask handlers to use it.
type provider struct {
	mu      sync.Mutex
	charged map[string]bool
}

func (p *provider) charge(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.charged == nil {
		p.charged = make(map[string]bool)
	}
	p.charged[id] = true
}

func (p *provider) charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charged)
}

// A handler passes the stable id to its provider, whose call times out
// after the charge was made (or whose record cannot be written after it),
// and answers 5xx. The stable id is the same on every attempt: the retry
// must reach the provider under it, or the card is charged twice.
func TestAServerErrorKeepsTheStableIDForTheRetry(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]func(w http.ResponseWriter, r *http.Request){
		"provider timed out": func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusGatewayTimeout) },
		"record not written": func(w http.ResponseWriter, r *http.Request) {
			_ = idempotency.OnCommit(r.Context(), func(context.Context) error { return errors.New("the database went away") })
			w.WriteHeader(http.StatusCreated)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var p provider
			var runs atomic.Int32
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				info, _ := idempotency.FromContext(r.Context())
				p.charge(info.StableID)
				if runs.Add(1) == 1 {
					fail(w, r)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			m := idempotency.New(h, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			first := serve(m, "k", `{"amount":1500}`)
			require.GreaterOrEqual(t, first.Code, 500)
			require.Equal(t, http.StatusCreated, serve(m, "k", `{"amount":1500}`).Code)
			assert.Equal(t, 1, p.charges(), "one charge at the provider")
		})
	}
}

// A record that expires while its worker still holds the lease would be
// replaced by the next request with its key, under a new stable id: the
// work would run twice. A retention no longer than the lease is refused.
func TestNewRefusesARetentionNoLongerThanTheLease(t *testing.T) {
	t.Parallel()
	store := &idempotency.MemoryStore{}
	for _, cfg := range []idempotency.Config{
		{Store: store, Principal: anyone, Retention: 10 * time.Second},
		{Store: store, Principal: anyone, Retention: time.Minute, Lease: time.Minute},
		{Store: store, Principal: anyone, Lease: 25 * time.Hour},
	} {
		assert.PanicsWithValue(t, fmt.Sprintf("idempotency: Config.Retention (%s) must be longer than Config.Lease (%s)",
			cmp.Or(cfg.Retention, idempotency.DefaultRetention), cmp.Or(cfg.Lease, idempotency.DefaultLease)),
			func() { idempotency.New(&counter{status: 201}, cfg) })
	}
	assert.NotPanics(t, func() {
		idempotency.New(&counter{status: 201}, idempotency.Config{Principal: anyone, Store: store, Retention: time.Minute})
	})
}

// failingStore fails every Insert with err, as a database does when a
// statement times out or a table is gone.
type failingStore struct {
	idempotency.Store
	err error
}

func (s failingStore) Insert(context.Context, *idempotency.Record) (*idempotency.Record, bool, error) {
	return nil, false, s.err
}

// TestStoreErrorTextIsLoggedNeverShown: when the store fails, the client
// gets a 500 problem that says nothing internal (no database message, no
// index or table name); the error goes to Config.Logger.
func TestStoreErrorTextIsLoggedNeverShown(t *testing.T) {
	t.Parallel()
	secret := `pgstore: insert key "k": ERROR: duplicate key value violates unique constraint "idempotency_records_pkey" (SQLSTATE 23505)`
	var logged strings.Builder
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	c := &counter{status: 201}
	m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: failingStore{&idempotency.MemoryStore{}, errors.New(secret)}, Logger: logger})
	w := serve(m, "k", "x")
	assert.Equal(t, http.StatusInternalServerError, w.Code)
	assert.Contains(t, w.Body.String(), idempotency.TypeInternal)
	for _, internal := range []string{"pgstore", "SQLSTATE", "idempotency_records", "duplicate key"} {
		assert.NotContains(t, w.Body.String(), internal)
	}
	assert.Contains(t, logged.String(), "SQLSTATE 23505", "the error is logged")
	assert.Zero(t, c.runs.Load())
}

// TestNewRequiresThePrincipal: there is no default scope. A default that
// read the Authorization header would make a refreshed token another
// caller, whose retry finds no record and runs the work again; so New
// refuses a Config without Principal, and the scope is whatever account
// Principal returns.
func TestNewRequiresThePrincipal(t *testing.T) {
	t.Parallel()
	assert.PanicsWithValue(t, "idempotency: Config.Principal is nil: return the account the request acts for, "+
		"as the server's authentication found it, not its credential (a refreshed token must be the same caller)",
		func() {
			idempotency.New(&counter{status: 201}, idempotency.Config{Store: &idempotency.MemoryStore{}})
		})

	account := func(r *http.Request) string { return strings.SplitN(r.Header.Get("Authorization"), ".", 2)[0] }
	c := &counter{status: 201}
	m := idempotency.New(c, idempotency.Config{Store: &idempotency.MemoryStore{}, Principal: account})
	send := func(auth string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader("x"))
		r.Header.Set(idempotency.HeaderKey, "k")
		r.Header.Set("Authorization", auth)
		w := httptest.NewRecorder()
		m.ServeHTTP(w, r)
		return w
	}
	require.Equal(t, 201, send("acct1.token-before-refresh").Code)
	again := send("acct1.token-after-refresh")
	assert.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "the same account, another token: a replay")
	assert.Empty(t, send("acct2.token").Header().Get(idempotency.HeaderReplayed), "another account has its own key")
	assert.Equal(t, int32(2), c.runs.Load())
}

func serveURL(h http.Handler, target, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestTheQueryIsPartOfTheContent: a key reused with another query is 422
// (a handler that reads the query would otherwise get another request's
// answer); the same parameters in another order replay; a record
// fingerprinted before the query counted (version 1) still replays for its
// retry.
func TestTheQueryIsPartOfTheContent(t *testing.T) {
	t.Parallel()
	store := &idempotency.MemoryStore{}
	c := &counter{status: 201}
	m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0)})

	require.Equal(t, 201, serveURL(m, "/things?param1=a&param2=b", "k1", "x").Code)
	reused := serveURL(m, "/things?param1=a&param2=c", "k1", "x")
	assert.Equal(t, http.StatusUnprocessableEntity, reused.Code)
	assert.Contains(t, reused.Body.String(), idempotency.TypeKeyReused)
	reordered := serveURL(m, "/things?param2=b&param1=a", "k1", "x")
	assert.Equal(t, 201, reordered.Code)
	assert.Equal(t, "true", reordered.Header().Get(idempotency.HeaderReplayed))
	assert.Equal(t, int32(1), c.runs.Load())

	// A record stored by the version before the query counted.
	old, err := idempotency.NewFingerprintVersion(idempotency.FingerprintV1, http.MethodPost, "/things", "", []byte("x"), 0)
	require.NoError(t, err)
	id := idempotency.ID{Principal: "", Key: "k-old"}
	_, inserted, err := store.Insert(context.Background(), &idempotency.Record{ID: id, Fingerprint: old, Status: idempotency.StatusInProgress,
		StableID: "st", Owner: "w", LockedUntil: t0.Add(time.Minute), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)})
	require.NoError(t, err)
	require.True(t, inserted)
	require.NoError(t, store.Complete(context.Background(), id, "w", &idempotency.Response{StatusCode: 201, Body: []byte("old")}, nil))
	retry := serveURL(m, "/things?param2=b", "k-old", "x")
	assert.Equal(t, 201, retry.Code)
	assert.Equal(t, "old", retry.Body.String(), "the version-1 record's retry replays it")
	assert.Equal(t, http.StatusUnprocessableEntity, serveURL(m, "/things", "k-old", "y").Code, "another body is still another request")
	assert.Equal(t, int32(1), c.runs.Load())
}

// TestEveryAnswerToAKeyedRequestEchoesTheKey: the middleware marks each of
// its answers with the key as received, so a client can tell them from a
// proxy's: fresh, replayed, in progress, reused, invalid, a server error.
func TestEveryAnswerToAKeyedRequestEchoesTheKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		key    string
		prep   func(h http.Handler) // requests made before the one checked
		status int
		block  bool
		body   string
		handle int
	}{
		{name: "fresh", key: "k-fresh", status: 201, handle: 201},
		{name: "quoted as received", key: `"k-quoted"`, status: 201, handle: 201},
		{name: "replayed", key: "k-replay", status: 201, handle: 201,
			prep: func(h http.Handler) { serve(h, "k-replay", "a") }},
		{name: "reused", key: "k-reuse", status: 422, handle: 201,
			prep: func(h http.Handler) { serve(h, "k-reuse", "other") }},
		{name: "invalid key", key: "k\x01bad", status: 400, handle: 201},
		{name: "server error", key: "k-500", status: 500, handle: 500},
		{name: "business outcome", key: "k-402", status: 402, handle: 402},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := idempotency.New(&counter{status: tt.handle}, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			if tt.prep != nil {
				tt.prep(h)
			}
			w := serve(h, tt.key, "a")
			require.Equal(t, tt.status, w.Code)
			assert.Equal(t, []string{tt.key}, w.Header().Values(idempotency.HeaderKey))
		})
	}
	t.Run("in progress", func(t *testing.T) {
		t.Parallel()
		c := &counter{status: 201, block: make(chan struct{})}
		h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
		done := make(chan struct{})
		go func() { defer close(done); serve(h, "k-409", "a") }()
		require.Eventually(t, func() bool { return c.runs.Load() == 1 }, 5*time.Second, time.Millisecond)
		w := serve(h, "k-409", "a")
		close(c.block)
		<-done
		require.Equal(t, http.StatusConflict, w.Code)
		assert.Equal(t, "k-409", w.Header().Get(idempotency.HeaderKey))
	})
	t.Run("no key, no echo", func(t *testing.T) {
		t.Parallel()
		h := idempotency.New(&counter{status: 201}, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
		w := serve(h, "", "a")
		require.Equal(t, http.StatusBadRequest, w.Code)
		assert.Empty(t, w.Header().Values(idempotency.HeaderKey))
	})
}

// TestValidateGetsTheFingerprintsReading: the validation hook finds the
// fingerprint's reading of a JSON body on the request (internal/jsonbody),
// so that it need not parse the body again; the body still reads in full,
// in the hook and in the handler, which gets no reading.
func TestValidateGetsTheFingerprintsReading(t *testing.T) {
	type member struct{ name, value string }
	for _, tt := range []struct {
		body    string
		json    bool
		members []member // nil: not an object
	}{
		{` {"b":"x\u0041","a":[1],"c":{"d":1},"ę":-1.5e3,"\u0066":null} `, true,
			[]member{{"a", "["}, {"b", `"x\u0041"`}, {"c", "{"}, {"f", "null"}, {"ę", "-1.5e3"}}},
		{`{}`, true, []member{}},
		{`[{"a":1}]`, true, nil},
		{`"s"`, true, nil},
		{`{"a":1`, false, nil},
		{``, false, nil},
	} {
		var inHook, inHandler bool
		h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, inHandler = jsonbody.ReadingOf(r)
			b, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Equal(t, tt.body, string(b), "the handler reads the body in full")
			w.WriteHeader(http.StatusCreated)
		}), idempotency.Config{Store: &idempotency.MemoryStore{}, Principal: anyone,
			Validate: func(r *http.Request, body []byte) (any, *idempotency.Problem) {
				rd, ok := jsonbody.ReadingOf(r)
				inHook = ok
				if ok {
					var got []member
					if n := rd.Len(); n >= 0 {
						got = []member{}
						for i := range n {
							name, value := rd.Member(i)
							got = append(got, member{string(name), string(value)})
						}
					}
					assert.Equal(t, tt.members, got, tt.body)
				}
				b, err := io.ReadAll(r.Body)
				require.NoError(t, err)
				assert.Equal(t, tt.body, string(b), "the hook reads the body in full")
				return nil, nil
			}})
		assert.Equal(t, http.StatusCreated, serve(h, "k1", tt.body).Code, tt.body)
		assert.Equal(t, tt.json, inHook, "a reading in the hook of %q", tt.body)
		assert.False(t, inHandler, "a reading in the handler of %q", tt.body)
	}
}

// TestLeasesAreJudgedOnTheStoresClock: hosts whose clocks are an hour
// ahead of the store's, or an hour behind, answer as a host on the store's
// clock does. A duplicate's 409 says to retry after the work's expected
// time, and a dead worker's record is taken over once its lease has ended
// by the store's clock, not the host's.
func TestLeasesAreJudgedOnTheStoresClock(t *testing.T) {
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		name := "an hour ahead"
		if skew < 0 {
			name = "an hour behind"
		}
		t.Run("a 409's Retry-After counts on the store's clock, host "+name, func(t *testing.T) {
			storeClk := clock.NewManual(t0)
			store := &idempotency.MemoryStore{Clock: storeClk}
			cfg := func(skew time.Duration) idempotency.Config {
				return idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0.Add(skew)),
					Lease: 10 * time.Second, Expected: 3 * time.Second}
			}
			slow := &counter{status: 201, block: make(chan struct{})}
			var wg sync.WaitGroup
			wg.Go(func() { serve(idempotency.New(slow, cfg(0)), "k", "x") })
			require.Eventually(t, func() bool { return slow.runs.Load() == 1 }, 10*time.Second, time.Millisecond)

			other := &counter{status: 201}
			w := serve(idempotency.New(other, cfg(skew)), "k", "x")
			assert.Equal(t, http.StatusConflict, w.Code)
			assert.Equal(t, "3", w.Header().Get("Retry-After"), "the work is expected in 3 s on the store's clock")
			assert.Zero(t, other.runs.Load())
			close(slow.block)
			wg.Wait()
		})
		t.Run("a dead worker's record is taken over when its lease ends on the store's clock, host "+name, func(t *testing.T) {
			storeClk := clock.NewManual(t0)
			store := &idempotency.MemoryStore{Clock: storeClk}
			var infos []idempotency.Info
			var mu sync.Mutex
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				info, _ := idempotency.FromContext(r.Context())
				mu.Lock()
				infos = append(infos, info)
				first := len(infos) == 1
				mu.Unlock()
				if first {
					panic(http.ErrAbortHandler) // the worker dies
				}
				w.WriteHeader(201)
			})
			cfg := idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0), Lease: 10 * time.Second}
			assert.PanicsWithValue(t, http.ErrAbortHandler, func() { serve(idempotency.New(h, cfg), "k", "x") })

			cfg.Clock = clock.NewManual(t0.Add(skew))
			skewed := idempotency.New(h, cfg)
			storeClk.Advance(9 * time.Second)
			w := serve(skewed, "k", "x")
			assert.Equal(t, http.StatusConflict, w.Code, "the lease is alive on the store's clock")
			assert.Equal(t, "1", w.Header().Get("Retry-After"), "the lease ends in 1 s on the store's clock")
			storeClk.Advance(time.Second)
			w = serve(skewed, "k", "x")
			require.Equal(t, 201, w.Code, "the lease has ended on the store's clock: %s", w.Body)
			require.Len(t, infos, 2)
			assert.True(t, infos[1].Takeover)
			assert.Equal(t, infos[0].StableID, infos[1].StableID)
		})
		t.Run("a full store's Retry-After counts on the store's clock, host "+name, func(t *testing.T) {
			storeClk := clock.NewManual(t0)
			store := &idempotency.MemoryStore{Clock: storeClk, MaxRecords: 1}
			c := &counter{status: 201}
			cfg := idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0), Retention: time.Hour}
			require.Equal(t, 201, serve(idempotency.New(c, cfg), "a", "x").Code)
			storeClk.Advance(time.Minute)
			cfg.Clock = clock.NewManual(t0.Add(skew))
			w := serve(idempotency.New(c, cfg), "b", "x")
			assert.Equal(t, http.StatusServiceUnavailable, w.Code)
			assert.Equal(t, "3540", w.Header().Get("Retry-After"), "59 minutes until the record of a expires, on the store's clock")
		})
	}
}

// unansweredStore is a MemoryStore whose Insert or Complete gets no
// answer within its bound, as pgstore's does when the database stops
// answering: the error matches context.DeadlineExceeded. A Complete with
// no answer has committed.
type unansweredStore struct {
	*idempotency.MemoryStore
	insert bool
}

func (s unansweredStore) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	if s.insert {
		return nil, false, fmt.Errorf("no answer from the database within 2s: %w", context.DeadlineExceeded)
	}
	return s.MemoryStore.Insert(ctx, rec)
}

func (s unansweredStore) Complete(ctx context.Context, id idempotency.ID, owner string, resp *idempotency.Response, commit func(context.Context) error) error {
	if err := s.MemoryStore.Complete(ctx, id, owner, resp, commit); err != nil {
		return err
	}
	return fmt.Errorf("commit: no answer from the database within 10s: %w", context.DeadlineExceeded)
}

// TestAStoreWithoutAnswerIsServiceUnavailable: a store call that gets no
// answer within the store's bound is a 503 with Retry-After, never the
// handler's answer. Before the handler, the handler does not run; after
// it (a commit that got no answer, and committed), the retry replays the
// stored answer.
func TestAStoreWithoutAnswerIsServiceUnavailable(t *testing.T) {
	t.Parallel()
	t.Run("an insert without answer: the handler does not run", func(t *testing.T) {
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: unansweredStore{&idempotency.MemoryStore{}, true}})
		w := serve(m, "k", "x")
		assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.Zero(t, c.runs.Load())
	})
	t.Run("a commit without answer: 503, and the retry replays what committed", func(t *testing.T) {
		c := &counter{status: 201}
		mem := &idempotency.MemoryStore{}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: unansweredStore{mem, false}})
		w := serve(m, "k", "x")
		assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.NotContains(t, w.Body.String(), "done", "the handler's answer went out")
		w = serve(idempotency.New(c, idempotency.Config{Principal: anyone, Store: mem}), "k", "x")
		assert.Equal(t, 201, w.Code)
		assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		assert.EqualValues(t, 1, c.runs.Load())
	})
}
