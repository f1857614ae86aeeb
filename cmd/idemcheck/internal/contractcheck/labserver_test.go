package contractcheck_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/cmd/idemcheck/internal/contractcheck"
	"github.com/idemkit/idem/idempotency"
)

// labConcurrency is the Concurrency the tests give the check; the lab
// server holds the work of a delayed key until that many duplicates have
// arrived, so that races show every time, whatever the machine's speed.
const labConcurrency = 5

// labHoldLimit bounds a hold, should the duplicates never come.
const labHoldLimit = 10 * time.Second

// labServer is a small payment server built on the idempotency middleware,
// with the fake server's admin endpoints (stats and key-scoped faults:
// delay, error, crash_after_provider), and knobs that each break one rule
// of the contract. With no knob set it keeps the whole contract.
//
// Its delay fault does not sleep: it holds the work until the other
// duplicates of the key have been answered (or a store's race window until
// they all arrived), at most labHoldLimit.
type labServer struct {
	clk *clock.Manual

	mu       sync.Mutex
	cond     *sync.Cond
	faults   map[string]string // key -> fault name
	held     map[string]bool   // keys whose work the delay fault holds
	answered map[string]int    // key -> requests answered
	lookups  map[string]int    // key -> racy store lookups
	charged  map[string]bool   // provider: stable id -> charged
	charges  int
	payments atomic.Int64 // committed by the store, under its own lock

	// The payments made, for the lookup by key; written by commits, which
	// run under the store's lock, so guarded by a lock of their own.
	ledgerMu sync.Mutex
	byKey    map[idempotency.ID]string // (caller, key) -> payment id
	last     string                    // the latest payment id
}

// labKnobs break the lab server.
type labKnobs struct {
	// store wraps the lab's MemoryStore; nil keeps it.
	store func(lab *labServer, s *idempotency.MemoryStore) idempotency.Store
	// principal replaces the Authorization-based scope.
	principal func(*http.Request) string
	// validateInHandler moves validation behind the middleware, so that a
	// refused body is stored under its key.
	validateInHandler bool
	// chargeOnTakeover charges again after taking over a dead worker's
	// record, without asking the provider first.
	chargeOnTakeover bool
	// lookupIgnoresKey answers the lookup by key with the latest payment,
	// whatever the key.
	lookupIgnoresKey bool
	// untypedMiss answers the lookup of an unused key with a plain 404.
	untypedMiss bool
	// wrap rewrites requests or answers in front of everything.
	wrap func(http.Handler) http.Handler
}

func startLab(t testing.TB, clk *clock.Manual, k labKnobs) string {
	t.Helper()
	lab := &labServer{clk: clk, faults: map[string]string{}, held: map[string]bool{}, answered: map[string]int{},
		lookups: map[string]int{}, charged: map[string]bool{}, byKey: map[idempotency.ID]string{}}
	lab.cond = sync.NewCond(&lab.mu)
	mem := &idempotency.MemoryStore{}
	var store idempotency.Store = mem
	if k.store != nil {
		store = k.store(lab, mem)
	}
	principal := k.principal
	if principal == nil {
		principal = func(r *http.Request) string { return r.Header.Get("Authorization") }
	}
	cfg := idempotency.Config{Store: store, Clock: clk, Principal: principal}
	if !k.validateInHandler {
		cfg.Validate = func(_ *http.Request, body []byte) (any, *idempotency.Problem) { return nil, validate(body) }
	}
	payments := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lab.pay(w, r, k)
	}), cfg)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_fake/stats", func(w http.ResponseWriter, r *http.Request) {
		lab.mu.Lock()
		defer lab.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]int64{"payments": lab.payments.Load(), "provider_charges": int64(lab.charges)})
	})
	mux.HandleFunc("POST /_fake/faults", func(w http.ResponseWriter, r *http.Request) {
		var f struct{ Fault, Key string }
		if err := json.NewDecoder(r.Body).Decode(&f); err != nil || f.Key == "" {
			http.Error(w, "want {fault, key}", http.StatusBadRequest)
			return
		}
		lab.mu.Lock()
		lab.faults[f.Key] = f.Fault
		if f.Fault == "delay" {
			lab.held[f.Key] = true
		}
		lab.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /payments", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotency-Key", r.URL.Query().Get("idempotency_key"))
		w.Header().Set("Cache-Control", "no-store")
		lab.ledgerMu.Lock()
		id, ok := lab.byKey[idempotency.ID{Principal: principal(r), Key: r.URL.Query().Get("idempotency_key")}]
		if k.lookupIgnoresKey {
			id, ok = lab.last, lab.last != ""
		}
		lab.ledgerMu.Unlock()
		if !ok && k.untypedMiss {
			http.Error(w, "no payment under this key", http.StatusNotFound)
			return
		}
		if !ok {
			(&idempotency.Problem{Type: contractcheck.DefaultProblemBase + "idempotency-key-unused", Title: "Idempotency-Key unused", Status: http.StatusNotFound}).Write(w)
			return
		}
		fmt.Fprintf(w, `{"id":%q}`+"\n", id)
	})
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		key, _ := idempotency.ParseKey(r.Header.Get("Idempotency-Key"))
		// The raw body, for a store that fingerprints bytes.
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		r = r.WithContext(context.WithValue(r.Context(), rawBodyKey{}, raw))
		defer func() {
			lab.mu.Lock()
			lab.answered[key]++
			lab.cond.Broadcast()
			lab.mu.Unlock()
		}()
		payments.ServeHTTP(w, r)
	})
	var h http.Handler = mux
	if k.wrap != nil {
		h = k.wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// validate accepts a JSON object with an integer amount > 0.
func validate(body []byte) *idempotency.Problem {
	var p struct{ Amount int64 }
	if json.Unmarshal(body, &p) != nil || p.Amount <= 0 {
		return &idempotency.Problem{Type: contractcheck.DefaultProblemBase + "validation-failed", Title: "Validation failed",
			Status: http.StatusBadRequest, Detail: "want a JSON object with an amount > 0"}
	}
	return nil
}

// waitFor waits, with lab.mu held, until cond holds or labHoldLimit passes.
func (lab *labServer) waitFor(cond func() bool) {
	timer := time.AfterFunc(labHoldLimit, func() {
		lab.mu.Lock()
		defer lab.mu.Unlock()
		lab.cond.Broadcast()
	})
	defer timer.Stop()
	deadline := time.Now().Add(labHoldLimit)
	for !cond() && time.Now().Before(deadline) {
		lab.cond.Wait()
	}
}

// pay is the business handler: charge the provider under the record's
// stable id (asking it first after a takeover), commit the payment.
func (lab *labServer) pay(w http.ResponseWriter, r *http.Request, k labKnobs) {
	info, _ := idempotency.FromContext(r.Context())
	if k.validateInHandler {
		body, _ := io.ReadAll(r.Body)
		if p := validate(body); p != nil {
			p.Write(w)
			return
		}
	}
	key := info.ID.Key
	lab.mu.Lock()
	f := lab.faults[key]
	delete(lab.faults, key)
	if f == "delay" {
		lab.waitFor(func() bool { return lab.answered[key] >= labConcurrency-1 })
		delete(lab.held, key)
	}
	lab.mu.Unlock()
	if f == "error" {
		idempotency.NothingDone(r.Context()) // before the provider: the key is free again
		(&idempotency.Problem{Type: contractcheck.DefaultProblemBase + "internal-error", Title: "Injected error", Status: http.StatusInternalServerError}).Write(w)
		return
	}
	lab.mu.Lock()
	if !(info.Takeover && lab.charged[info.StableID]) || k.chargeOnTakeover {
		lab.charged[info.StableID] = true
		lab.charges++
	}
	lab.mu.Unlock()
	if f == "crash_after_provider" {
		panic(http.ErrAbortHandler) // the record stays IN_PROGRESS
	}
	_ = idempotency.OnCommit(r.Context(), func(context.Context) error {
		lab.payments.Add(1)
		lab.ledgerMu.Lock()
		defer lab.ledgerMu.Unlock()
		lab.byKey[info.ID], lab.last = info.StableID, info.StableID
		return nil
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+info.StableID)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"status":"succeeded","created_at":%q}`+"\n", info.StableID, lab.clk.Now().Format(time.RFC3339))
}

// racyStore looks a key up first and inserts later, as a SELECT then an
// INSERT without a unique constraint does, and completes a record whoever
// holds it. Its race window is held open for delayed keys until every
// duplicate has looked up.
type racyStore struct {
	*idempotency.MemoryStore
	lab *labServer

	mu   sync.Mutex
	recs map[idempotency.ID]*idempotency.Record
}

func newRacyStore(lab *labServer, _ *idempotency.MemoryStore) idempotency.Store {
	return &racyStore{lab: lab, recs: map[idempotency.ID]*idempotency.Record{}}
}

func (s *racyStore) Insert(_ context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	s.mu.Lock()
	old, ok := s.recs[rec.ID]
	s.mu.Unlock()
	if ok && !old.Expired(rec.CreatedAt) {
		cp := *old
		return &cp, false, nil
	}
	lab := s.lab
	lab.mu.Lock()
	if lab.held[rec.ID.Key] {
		lab.lookups[rec.ID.Key]++
		lab.cond.Broadcast()
		lab.waitFor(func() bool { return lab.lookups[rec.ID.Key] >= labConcurrency })
	}
	lab.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := *rec
	s.recs[rec.ID] = &cp
	return nil, true, nil
}

func (s *racyStore) TakeOver(_ context.Context, id idempotency.ID, from, to string, now, until time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok || r.Status != idempotency.StatusInProgress || r.Owner != from || r.LockedUntil.After(now) {
		return false, nil
	}
	r.Owner, r.LockedUntil = to, until
	return true, nil
}

func (s *racyStore) Complete(ctx context.Context, id idempotency.ID, _ string, resp *idempotency.Response, commit func(context.Context) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return idempotency.ErrNotOwner
	}
	if commit != nil {
		if err := commit(ctx); err != nil {
			return err
		}
	}
	r.Status, r.Response = idempotency.StatusCompleted, resp
	return nil
}

func (s *racyStore) Release(_ context.Context, id idempotency.ID, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.recs[id]; !ok || r.Owner != owner {
		return idempotency.ErrNotOwner
	}
	delete(s.recs, id)
	return nil
}

// blindStore never compares fingerprints: any request with a known key is
// taken for the same request.
type blindStore struct{ idempotency.Store }

func (s blindStore) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	old, ok, err := s.Store.Insert(ctx, rec)
	if old != nil {
		old.Fingerprint = rec.Fingerprint
	}
	return old, ok, err
}

type rawBodyKey struct{}

// byteStore fingerprints the body's bytes, not its JSON: a re-serialised
// body counts as another request.
type byteStore struct{ idempotency.Store }

func (s byteStore) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	raw, _ := ctx.Value(rawBodyKey{}).([]byte)
	rec.Fingerprint = sha256.Sum256(raw)
	return s.Store.Insert(ctx, rec)
}

// errorStoringStore keeps a 5xx under its key instead of freeing it.
type errorStoringStore struct{ idempotency.Store }

func (s errorStoringStore) Release(ctx context.Context, id idempotency.ID, owner string) error {
	body := `{"type":"` + contractcheck.DefaultProblemBase + "internal-error" + `","title":"Internal server error","status":500}` + "\n"
	return s.Store.Complete(ctx, id, owner, &idempotency.Response{StatusCode: http.StatusInternalServerError,
		Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(body)}, nil)
}

// editAnswers is a wrap that changes the answer's header before it is
// sent.
func editAnswers(edit func(status int, h http.Header)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(&editWriter{ResponseWriter: w, edit: edit}, r)
		})
	}
}

type editWriter struct {
	http.ResponseWriter
	edit        func(int, http.Header)
	wroteHeader bool
}

func (w *editWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		w.edit(code, w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *editWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// quotesInKey takes a quoted key's quotes as part of it, as a server that
// does not parse RFC 8941 strings does (an apostrophe stands for the quote,
// which the middleware would otherwise parse).
func quotesInKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Idempotency-Key"); strings.HasPrefix(v, `"`) {
			r.Header.Set("Idempotency-Key", strings.ReplaceAll(v, `"`, `'`))
			w = echoAsReceived(w, []string{v})
		}
		next.ServeHTTP(w, r)
	})
}

// echoAsReceived puts the key as it arrived back on the answer, for the
// wraps that rewrite it before the middleware (which echoes what it got).
func echoAsReceived(w http.ResponseWriter, received []string) http.ResponseWriter {
	return &editWriter{ResponseWriter: w, edit: func(_ int, h http.Header) { h["Idempotency-Key"] = received }}
}

// acceptsMalformedKeys serves a key it cannot parse under a key made from
// its bytes, as a server that stores whatever it is sent does.
func acceptsMalformedKeys(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		vals := r.Header.Values("Idempotency-Key")
		malformed := len(vals) > 1 // one field, as the middleware reads it
		if len(vals) == 1 {
			_, err := idempotency.ParseKey(vals[0])
			malformed = err != nil
		}
		if malformed {
			sum := sha256.Sum256([]byte(strings.Join(vals, "\n")))
			w = echoAsReceived(w, append([]string(nil), vals...))
			r.Header.Set("Idempotency-Key", hex.EncodeToString(sum[:]))
		}
		next.ServeHTTP(w, r)
	})
}

// keyOptional serves a request without a key under a new random key: no
// protection, and no error either.
func keyOptional(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/payments" && len(r.Header.Values("Idempotency-Key")) == 0 {
			r.Header.Set("Idempotency-Key", rand.Text())
		}
		next.ServeHTTP(w, r)
	})
}
