package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/idempotency"
)

// The server of the world: idem's idempotency middleware in front of a
// payments handler shaped like the fake server's, a payment provider with
// its own idempotency on the server's stable id, and a record store that
// can pause (so that requests interleave), fail, and lose its workers.

// charge is one charge the provider made.
type charge struct {
	stableID  string
	principal string
	key       string // the Idempotency-Key of the request that made it
	amount    int64
	customer  string
	desc      string // names the cart: "d3/shop/s5/c2"
	at        time.Time
	// seeOther: the server answers the payment with 303 See Other to
	// it, not 201 (server.see-other).
	seeOther bool
}

// serverFaults are what the world does to one request inside the server.
type serverFaults struct {
	crashAfterInsert   bool
	crashAfterProvider bool
	errorBeforeCharge  bool          // a 500 before the provider is called; nothing charged
	slow               time.Duration // the work pauses this long before the provider call
	storeError         string        // the store op that fails: "insert", "complete", or ""
}

type faultsKey struct{}
type takeoverKey struct{}

// takeoverOf is where the handler notes that it took over a record.
func takeoverOf(ctx context.Context) *bool {
	if b, ok := ctx.Value(takeoverKey{}).(*bool); ok {
		return b
	}
	return new(bool)
}

type procKey struct{}

func procOf(ctx context.Context) *proc {
	p, _ := ctx.Value(procKey{}).(*proc)
	return p
}

func faultsOf(ctx context.Context) serverFaults {
	f, _ := ctx.Value(faultsKey{}).(serverFaults)
	return f
}

// server is the world's payments server.
type server struct {
	w        *world
	store    *yieldStore
	handler  http.Handler
	charges  []*charge
	byStable map[string]*charge
	// byKey holds the charges by principal and key in either spelling.
	byKey  map[idempotency.ID][]*charge
	ledger map[idempotency.ID][]byte // the payment's JSON, by key
	stable int
	// stored5xx holds the answers of a server that stores its 500s and
	// replays them, as some servers do (Options.Stored5xx).
	stored5xx map[idempotency.ID]bool
	// faults decide what the server does to each POST.
	faults fault.Injector
	// seeOther picks the charges answered 303 (server.see-other).
	seeOther fault.Injector
}

var errStoreDown = errors.New("sim: the record store is unavailable")

func newServer(w *world) *server {
	s := &server{
		w:         w,
		store:     &yieldStore{w: w, mem: &idempotency.MemoryStore{}, pauses: storePauses(w)},
		faults:    serverFaultRules(w),
		seeOther:  seeOtherRule(w),
		byStable:  make(map[string]*charge),
		byKey:     make(map[idempotency.ID][]*charge),
		ledger:    make(map[idempotency.ID][]byte),
		stored5xx: make(map[idempotency.ID]bool),
	}
	s.handler = idempotency.New(http.HandlerFunc(s.createPayment), idempotency.Config{
		Store: s.store,
		// The simulated device names itself in Authorization and never
		// refreshes it: the credential is the account.
		Principal: func(r *http.Request) string { return r.Header.Get("Authorization") },
		Clock:     worldClock{w},
		Retention: w.cfg.Retention,
		Lease:     w.cfg.Lease,
		Validate:  validatePayment,
		OnOutcome: func(_ *http.Request, o string) { w.stats.count(&w.stats.Outcomes, o) },
		NewStableID: func() string {
			s.stable++
			return "st_" + strconv.Itoa(s.stable)
		},
	})
	return s
}

// worldClock is the server's clock: the world's true time.
type worldClock struct{ w *world }

// SinceBoot: a server has no reading of a device's sleep.
func (worldClock) SinceBoot() (time.Duration, string, bool) { return 0, "", false }

func (c worldClock) Now() time.Time { return c.w.clk.now }

// Sleep lets the world run for d; the server's middleware never calls it.
func (c worldClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.w.clk.advanceTo(c.w.clk.now.Add(d))
	return nil
}

// paymentRequest is the body of POST /payments. encoding/json matches
// member names without regard to case, as the fake server's handler does.
type paymentRequest struct {
	Amount      *int64  `json:"amount"`
	Currency    *string `json:"currency"`
	Customer    *string `json:"customer"`
	Description string  `json:"description"`
}

func validatePayment(_ *http.Request, body []byte) (any, *idempotency.Problem) {
	var req paymentRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Amount == nil || *req.Amount <= 0 || req.Currency == nil || req.Customer == nil {
		return nil, &idempotency.Problem{Type: "https://sim.invalid/problems/validation", Title: "Invalid payment", Status: http.StatusBadRequest}
	}
	return req, nil
}

const declinedCustomer = "cus_declined"

// createPayment is the business handler behind the middleware.
func (s *server) createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := procOf(ctx)
	info, _ := idempotency.FromContext(ctx)
	req := info.Validated.(paymentRequest)
	f := faultsOf(ctx)
	if f.crashAfterInsert {
		s.w.stats.fault(faultCrashAfterInsert.Name())
		panic(http.ErrAbortHandler)
	}
	if f.slow > 0 {
		p.sleep(f.slow)
	}
	if f.errorBeforeCharge {
		if info.Takeover {
			// Another worker of this key may still charge: a server that
			// stores its 500s must not store this one.
			*takeoverOf(ctx) = true
		}
		s.w.stats.fault(faultError500.Name())
		writeProblem(w, http.StatusInternalServerError, "error", "")
		return
	}
	if s.w.cfg.Stored5xx && s.stored5xx[info.ID] {
		// A 500 stored for the key while this request waited is its
		// answer too.
		writeProblem(w, http.StatusInternalServerError, "error", "")
		return
	}
	// The provider is idempotent on the stable id: a second charge call
	// with it returns the first charge. After a takeover the handler asks
	// first, as the fake server does.
	ch, charged := s.byStable[info.StableID]
	if !charged {
		if *req.Customer == declinedCustomer {
			writeProblem(w, http.StatusPaymentRequired, "card-declined", "")
			return
		}
		ch = &charge{stableID: info.StableID, principal: info.ID.Principal, key: info.ID.Key, amount: *req.Amount,
			customer: *req.Customer, desc: req.Description, at: s.w.clk.now}
		ch.seeOther = s.seeOther.Inject(fault.Op{}).Has(seeOther)
		s.byStable[info.StableID] = ch
		s.charges = append(s.charges, ch)
		bare := idempotency.ID{Principal: ch.principal, Key: strings.TrimSuffix(ch.key, rawQuotedSuffix)}
		s.byKey[bare] = append(s.byKey[bare], ch)
		s.w.tracef("server charges %s key %s for %s", ch.stableID, ch.key, ch.desc)
	}
	if f.crashAfterProvider {
		s.w.stats.fault(faultCrashAfterCharge.Name())
		panic(http.ErrAbortHandler)
	}
	out := paymentJSON(ch)
	id := info.ID
	_ = idempotency.OnCommit(ctx, func(context.Context) error {
		s.ledger[id] = out
		return nil
	})
	w.Header().Set("Location", "/payments/"+ch.stableID)
	if ch.seeOther {
		// The work is done; its result is at Location. The middleware
		// stores and replays this answer like any other.
		w.WriteHeader(http.StatusSeeOther)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

// payment serves GET /payments/{id}, where a 303 sends the app's own
// http.Client.
func (s *server) payment(w http.ResponseWriter, id string) {
	ch, ok := s.byStable[id]
	if !ok {
		writeProblem(w, http.StatusNotFound, "not-found", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(paymentJSON(ch))
}

// charged reports a charge under key, as the request spelled it, for
// principal.
func (s *server) charged(principal, key string) bool {
	for _, ch := range s.byKey[idempotency.ID{Principal: principal, Key: strings.TrimSuffix(key, rawQuotedSuffix)}] {
		if ch.key == key {
			return true
		}
	}
	return false
}

func paymentJSON(ch *charge) []byte {
	out, _ := json.Marshal(map[string]any{"id": ch.stableID, "amount": ch.amount, "customer": ch.customer,
		"description": ch.desc, "status": "succeeded"})
	return out
}

// oneKey is the request's key as the middleware reads it: its one
// Idempotency-Key field, parsed.
func oneKey(h http.Header) (string, bool) {
	vals := h.Values("Idempotency-Key")
	if len(vals) != 1 {
		return "", false
	}
	k, err := idempotency.ParseKey(vals[0])
	return k, err == nil
}

// lookup serves GET /payments?idempotency_key=K: the payment, or 409 while
// a record for the key is in progress, or 404.
//
// Every answer is marked as the contract asks: the key of the query echoed
// as received, and no-store; the 404 is the typed miss.
func (s *server) lookup(w http.ResponseWriter, r *http.Request) {
	idempotency.MarkLookup(w, r, r.URL.Query().Get("idempotency_key"))
	key, err := idempotency.ParseKey(r.URL.Query().Get("idempotency_key"))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "idempotency-key-invalid", "")
		return
	}
	id := idempotency.ID{Principal: r.Header.Get("Authorization"), Key: key}
	out, ok := s.ledger[id]
	if !ok && s.w.cfg.Faults[faultKeySpelling] {
		// The lookup finds a payment made under the key in either
		// spelling: the app asks with the key as Intent.Key returns it.
		out, ok = s.ledger[idempotency.ID{Principal: id.Principal, Key: key + rawQuotedSuffix}]
	}
	if !ok {
		// A worker that died after the provider call left a charge that
		// no record holds as completed: the provider knows it, and so
		// does this lookup, even after the record expired. (The fake
		// server's lookup asks only its ledger and its live records.)
		if chs := s.byKey[id]; len(chs) > 0 {
			out, ok = paymentJSON(chs[0]), true
		}
	}
	if ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(out)
		return
	}
	for _, k := range []string{key, key + rawQuotedSuffix} {
		if rec, ok := s.store.mem.Get(r.Context(), idempotency.ID{Principal: id.Principal, Key: k}, s.w.clk.now); ok && rec.Status == idempotency.StatusInProgress {
			writeProblem(w, http.StatusConflict, "request-in-progress", "1")
			return
		}
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, `{"type":%q,"title":"Idempotency-Key unused","status":404}`, "https://idem.dev/problems/idempotency-key-unused")
}

func writeProblem(w http.ResponseWriter, status int, typ, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"https://sim.invalid/problems/%s","title":%q,"status":%d}`, typ, http.StatusText(status), status)
}

// answer is what the server (or a box in front of it) sends back.
type answer struct {
	status int
	header http.Header
	body   []byte
	// aborted: the connection closed without an answer.
	aborted bool
}

// recorder is the ResponseWriter of an in-process request.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// serve handles one request on worker p and returns its answer.
func (s *server) serve(p *proc, method, url string, header http.Header, body []byte, f serverFaults) (a answer) {
	tookOver := new(bool)
	ctx := context.WithValue(context.WithValue(context.WithValue(context.Background(), procKey{}, p), faultsKey{}, f), takeoverKey{}, tookOver)
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return answer{status: http.StatusBadRequest, header: http.Header{}}
	}
	req.Header = header.Clone()
	// The key as it arrived, which the server echoes on its answers.
	received := header.Values("Idempotency-Key")
	if s.w.cfg.Faults[faultKeySpelling] {
		// This server compares raw key values, as some libraries do: "K"
		// and K are two keys to it.
		if v := req.Header.Get("Idempotency-Key"); strings.HasPrefix(v, `"`) {
			if k, err := idempotency.ParseKey(v); err == nil {
				req.Header.Set("Idempotency-Key", k+rawQuotedSuffix)
			}
		}
	}
	rec := &recorder{header: make(http.Header)}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // a sentinel panic value
				a = answer{aborted: true}
				return
			}
			panic(v)
		}
	}()
	switch {
	case req.URL.Path == "/payments" && method == http.MethodPost:
		if s.w.cfg.Stored5xx {
			if k, ok := oneKey(req.Header); ok && s.stored5xx[idempotency.ID{Principal: req.Header.Get("Authorization"), Key: k}] {
				s.w.stats.fault(faultStored5xx.Name())
				rec.header.Set("Idempotent-Replayed", "true")
				writeProblem(rec, http.StatusInternalServerError, "error", "")
				break
			}
		}
		s.handler.ServeHTTP(rec, req)
		if s.w.cfg.Stored5xx && rec.status == http.StatusInternalServerError && f.errorBeforeCharge {
			// It stores the 500 only when nothing was charged under the
			// key: a stored answer must be true.
			if k, ok := oneKey(req.Header); ok && !*tookOver && !s.charged(req.Header.Get("Authorization"), k) {
				s.stored5xx[idempotency.ID{Principal: req.Header.Get("Authorization"), Key: k}] = true
			}
		}
	case req.URL.Path == "/payments" && method == http.MethodGet:
		s.lookup(rec, req)
	case strings.HasPrefix(req.URL.Path, "/payments/") && method == http.MethodGet:
		s.payment(rec, strings.TrimPrefix(req.URL.Path, "/payments/"))
	case strings.HasPrefix(req.URL.Path, "/payments"):
		writeProblem(rec, http.StatusMethodNotAllowed, "method", "")
	default:
		writeProblem(rec, http.StatusNotFound, "not-found", "")
	}
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if len(received) > 0 {
		// The server marks its answers with the key as received, also
		// when it compared it raw.
		rec.header["Idempotency-Key"] = received
	}
	return answer{status: status, header: rec.header, body: rec.body.Bytes()}
}

// yieldStore is the server's record store: idempotency.MemoryStore, with a
// pause before each step (so that the world may run other requests
// between two steps of one) and the failures the request's faults ask for.
type yieldStore struct {
	w      *world
	mem    *idempotency.MemoryStore
	pauses fault.Injector
}

func (s *yieldStore) pause(ctx context.Context) {
	p := procOf(ctx)
	if p == nil {
		return
	}
	// Without a pause, requests due at this same instant get their turn.
	e, _ := s.pauses.Inject(fault.Op{}).Get(storePause)
	p.sleep(e.Delay)
}

func (s *yieldStore) fail(ctx context.Context, op string) bool {
	if faultsOf(ctx).storeError == op {
		if op == "insert" {
			s.w.stats.fault(faultStoreErrorInsert.Name())
		} else {
			s.w.stats.fault(faultStoreErrorComplete.Name())
		}
		return true
	}
	return false
}

func (s *yieldStore) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	s.pause(ctx)
	if s.fail(ctx, "insert") {
		return nil, false, errStoreDown
	}
	return s.mem.Insert(ctx, rec)
}

func (s *yieldStore) TakeOver(ctx context.Context, id idempotency.ID, from, to string, now, until time.Time) (bool, error) {
	s.pause(ctx)
	return s.mem.TakeOver(ctx, id, from, to, now, until)
}

func (s *yieldStore) Complete(ctx context.Context, id idempotency.ID, owner string, resp *idempotency.Response, commit func(context.Context) error) error {
	s.pause(ctx)
	if s.fail(ctx, "complete") {
		return errStoreDown
	}
	return s.mem.Complete(ctx, id, owner, resp, commit)
}

func (s *yieldStore) Release(ctx context.Context, id idempotency.ID, owner string) error {
	s.pause(ctx)
	return s.mem.Release(ctx, id, owner)
}

func (s *yieldStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	return s.mem.Sweep(ctx, now)
}

// Get is the lookup a middleware that looks a key up before inserting it
// would make; it pauses like every other step.
func (s *yieldStore) Get(ctx context.Context, id idempotency.ID, now time.Time) (*idempotency.Record, bool) {
	s.pause(ctx)
	return s.mem.Get(ctx, id, now)
}
