package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/idempotency"
)

// The server of the world is the fake server's own handler. The seed
// gives it its clock, its waits and its payment ids. Its record store
// pauses between steps, so that requests interleave, and fails on
// demand. Its workers die when the world says so. Three behaviours of
// other servers are modelled around it: stored 5xx answers, keys
// compared raw, and 303 See Other to a new charge.

// declinedCustomer is the customer whose card the provider declines.
const declinedCustomer = "cus_declined"

// charge is one charge the provider made.
type charge struct {
	stableID  string
	principal string
	key       string // the Idempotency-Key of the request that made it
	desc      string // names the cart: "d3/shop/s5/c2"
	at        time.Time
}

// serverFaults are what the world does to one request inside the server.
type serverFaults struct {
	crashAfterInsert   bool
	crashAfterProvider bool
	errorBeforeCharge  bool          // a 500 before the provider is called; nothing charged
	slow               time.Duration // the work pauses this long before the provider call
	storeError         string        // the store op that fails: "insert", "complete", or ""
}

// reqState is what the world notes about one request in the server.
type reqState struct {
	p         *proc
	f         serverFaults
	tookOver  bool // the request took over a dead worker's record
	inserted  bool // the request inserted its key's record
	stored5xx bool // a 500 stored for its key answered it
}

type reqKey struct{}

func stateOf(ctx context.Context) *reqState {
	if s, ok := ctx.Value(reqKey{}).(*reqState); ok {
		return s
	}
	return &reqState{}
}

func procOf(ctx context.Context) *proc { return stateOf(ctx).p }

func faultsOf(ctx context.Context) serverFaults { return stateOf(ctx).f }

// server is the world's payments server.
type server struct {
	w       *world
	store   *yieldStore
	handler *fakeserver.Handler
	stable  int
	traced  int // charges traced so far
	// cur holds the faults of the request entering the handler. The
	// handler's rules read it as the request starts.
	cur serverFaults
	// stored5xx holds the answers of a server that stores its 500s and
	// replays them, as some servers do (Options.Stored5xx).
	stored5xx map[idempotency.ID]bool
	// faults decide what the server does to each POST.
	faults fault.Injector
	// seeOther picks the charges answered 303 (server.see-other).
	seeOther fault.Injector
	// seeOthers holds, by stable id, whether a charge is answered 303.
	seeOthers map[string]bool
}

var (
	errStoreDown = errors.New("sim: the record store is unavailable")
	errStored5xx = errors.New("sim: a 500 is stored for the key")
)

func newServer(w *world) *server {
	s := &server{
		w:         w,
		faults:    serverFaultRules(w),
		seeOther:  seeOtherRule(w),
		stored5xx: make(map[idempotency.ID]bool),
		seeOthers: make(map[string]bool),
	}
	s.handler = fakeserver.NewHandler(&fakeserver.Options{
		Clock:     worldClock{w},
		Retention: w.cfg.Retention,
		Lease:     w.cfg.Lease,
		Sleep: func(ctx context.Context, d time.Duration) error {
			procOf(ctx).sleep(d)
			return ctx.Err()
		},
		NewID: func() string {
			s.stable++
			return "st_" + strconv.Itoa(s.stable)
		},
		WrapRecords: func(st idempotency.Store) idempotency.Store {
			s.store = &yieldStore{s: s, Store: st, pauses: storePauses(w)}
			return s.store
		},
		Logger: slog.New(outcomes{func(o string) { w.stats.count(&w.stats.Outcomes, o) }}),
	})
	for _, r := range s.handlerRules() {
		if err := s.handler.InjectRule(r); err != nil {
			panic(err)
		}
	}
	return s
}

// handlerRules strike as the request's drawn faults say.
func (s *server) handlerRules() []*fault.Rule {
	rule := func(has func(serverFaults) bool, k fault.Kind, c faultClass) *fault.Rule {
		return &fault.Rule{When: func(fault.Op) bool { return has(s.cur) }, Draw: func(fault.Op) fault.Effect {
			s.w.stats.fault(c.Name())
			return fault.Effect{Kind: k}
		}}
	}
	return []*fault.Rule{
		rule(func(f serverFaults) bool { return f.crashAfterInsert }, fault.CrashAfterInsert, faultCrashAfterInsert),
		rule(func(f serverFaults) bool { return f.crashAfterProvider }, fault.CrashAfterProvider, faultCrashAfterCharge),
		rule(func(f serverFaults) bool { return f.errorBeforeCharge }, fault.Error, faultError500),
		{When: func(fault.Op) bool { return s.cur.slow > 0 }, Draw: func(fault.Op) fault.Effect {
			return fault.Effect{Kind: fault.Delay, Delay: s.cur.slow}
		}},
	}
}

// outcomes counts the handler's answers by outcome, from its log.
type outcomes struct{ add func(outcome string) }

func (outcomes) Enabled(context.Context, slog.Level) bool { return true }
func (o outcomes) WithAttrs([]slog.Attr) slog.Handler     { return o }
func (o outcomes) WithGroup(string) slog.Handler          { return o }

func (o outcomes) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "outcome" {
			o.add(a.Value.String())
			return false
		}
		return true
	})
	return nil
}

// worldClock is the server's clock: the world's true time.
type worldClock struct{ w *world }

// SinceBoot: a server has no reading of a device's sleep.
func (worldClock) SinceBoot() (time.Duration, string, bool) { return 0, "", false }

func (c worldClock) Now() time.Time { return c.w.clk.now }

// Sleep lets the world run for d; the server never calls it.
func (c worldClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.w.clk.advanceTo(c.w.clk.now.Add(d))
	return nil
}

// charges returns the provider's charges, dead workers' included.
func (s *server) charges() []charge { return chargesOf(s.handler) }

// chargesOf returns h's provider's charges.
func chargesOf(h *fakeserver.Handler) []charge {
	chs, err := h.Charges()
	if err != nil {
		panic(err) // the fake server keeps its state in memory
	}
	out := make([]charge, len(chs))
	for i, c := range chs {
		out[i] = charge{stableID: c.ID, principal: c.Principal, key: c.Key, desc: c.Description, at: c.CreatedAt}
	}
	return out
}

// charged reports a charge under key, as the request spelled it, for
// principal.
func (s *server) charged(principal, key string) bool {
	for _, ch := range s.charges() {
		if ch.principal == principal && ch.key == key {
			return true
		}
	}
	return false
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
func (s *server) serve(p *proc, method, target string, header http.Header, body []byte, f serverFaults) (a answer) {
	st := &reqState{p: p, f: f}
	ctx := context.WithValue(context.Background(), reqKey{}, st)
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
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
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // a sentinel panic value
				a = answer{aborted: true}
				return
			}
			panic(v)
		}
	}()
	var rec *recorder
	switch {
	case req.URL.Path == "/payments" && method == http.MethodPost:
		rec = s.pay(req, st)
	case req.URL.Path == "/payments" && method == http.MethodGet && s.w.cfg.Faults[faultKeySpelling]:
		rec = s.lookupEitherSpelling(req)
	default:
		rec = s.run(req, serverFaults{})
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

// run serves req through the handler, whose rules strike as f says. The
// rules read s.cur as the request starts, before it can park.
func (s *server) run(req *http.Request, f serverFaults) *recorder {
	rec := &recorder{header: make(http.Header)}
	s.cur = f
	defer func() {
		s.cur = serverFaults{}
		s.traceCharges()
	}()
	s.handler.ServeHTTP(rec, req)
	return rec
}

// traceCharges traces the charges made since it was last called. It is
// called as each store step starts and as each request ends: a charge
// is made between two steps.
func (s *server) traceCharges() {
	if s.w.cfg.Trace == nil {
		return
	}
	chs := s.charges()
	for _, ch := range chs[s.traced:] {
		s.w.tracef("server charges %s key %s for %s", ch.stableID, ch.key, ch.desc)
	}
	s.traced = len(chs)
}

// pay serves a POST /payments, with the 5xx a server stores and the 303
// it answers for a new charge.
func (s *server) pay(req *http.Request, st *reqState) *recorder {
	principal := req.Header.Get("Authorization")
	k, keyOK := oneKey(req.Header)
	if s.w.cfg.Stored5xx && keyOK && s.stored5xx[idempotency.ID{Principal: principal, Key: k}] {
		return s.replay500()
	}
	rec := s.run(req, st.f)
	if st.stored5xx {
		// A 500 stored for the key while this request waited is its
		// answer too.
		return s.replay500()
	}
	if s.w.cfg.Stored5xx && rec.status == http.StatusInternalServerError && st.f.errorBeforeCharge && keyOK {
		// It stores the 500 only when nothing was charged under the key:
		// a stored answer must be true. And only when the request held the
		// key's record: a request whose insert failed, or that found
		// another worker's, has no say on what the key did.
		if st.inserted && !st.tookOver && !s.charged(principal, k) {
			s.stored5xx[idempotency.ID{Principal: principal, Key: k}] = true
		}
	}
	if rec.status == http.StatusCreated && s.seeOthers[strings.TrimPrefix(rec.header.Get("Location"), "/payments/")] {
		// The work is done; its result is at Location. The stored answer
		// is the 303 too (see yieldStore.Complete).
		loc := rec.header.Get("Location")
		rec = &recorder{header: http.Header{"Location": {loc}}, status: http.StatusSeeOther}
	}
	return rec
}

func (s *server) replay500() *recorder {
	s.w.stats.fault(faultStored5xx.Name())
	rec := &recorder{header: make(http.Header)}
	rec.header.Set("Idempotent-Replayed", "true")
	writeProblem(rec, http.StatusInternalServerError, "error", "")
	return rec
}

// lookupEitherSpelling asks the lookup for the key in either spelling: a
// server that compares raw keys finds a payment made under either. The
// app asks with the key as Intent.Key returns it.
func (s *server) lookupEitherSpelling(req *http.Request) *recorder {
	first := s.run(req, serverFaults{})
	if first.status == http.StatusOK {
		return first
	}
	q := req.URL.Query()
	q.Set("idempotency_key", q.Get("idempotency_key")+rawQuotedSuffix)
	u := *req.URL
	u.RawQuery = q.Encode()
	req2 := req.Clone(req.Context())
	req2.URL = &u
	second := s.run(req2, serverFaults{})
	pick := first
	if second.status == http.StatusOK || second.status == http.StatusConflict && first.status != http.StatusConflict {
		pick = second
	}
	// The answer is marked as the lookup asked.
	for _, h := range []string{"Idempotency-Key", idempotency.LookupNonceHeader, "Cache-Control"} {
		if v, ok := first.header[h]; ok {
			pick.header[h] = v
		}
	}
	return pick
}

// yieldStore is the handler's record store, with a pause before each
// step (so that the world may run other requests between two steps of
// one) and the failures the request's faults ask for.
type yieldStore struct {
	idempotency.Store
	s      *server
	pauses fault.Injector
}

func (y *yieldStore) pause(ctx context.Context) {
	y.s.traceCharges()
	p := procOf(ctx)
	if p == nil {
		return
	}
	// Without a pause, requests due at this same instant get their turn.
	e, _ := y.pauses.Inject(fault.Op{}).Get(storePause)
	p.sleep(e.Delay)
}

func (y *yieldStore) fail(ctx context.Context, op string) bool {
	if faultsOf(ctx).storeError == op {
		if op == "insert" {
			y.s.w.stats.fault(faultStoreErrorInsert.Name())
		} else {
			y.s.w.stats.fault(faultStoreErrorComplete.Name())
		}
		return true
	}
	return false
}

// stored reports a 500 stored for id, and notes that it answers ctx's
// request: the work must not start.
func (y *yieldStore) stored(ctx context.Context, id idempotency.ID) bool {
	if !y.s.w.cfg.Stored5xx {
		return false
	}
	if y.s.stored5xx[id] {
		stateOf(ctx).stored5xx = true
		return true
	}
	return false
}

func (y *yieldStore) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	y.pause(ctx)
	if y.fail(ctx, "insert") {
		return nil, false, errStoreDown
	}
	if y.stored(ctx, rec.ID) {
		return nil, false, errStored5xx
	}
	existing, inserted, err := y.Store.Insert(ctx, rec)
	stateOf(ctx).inserted = inserted && err == nil
	return existing, inserted, err
}

func (y *yieldStore) TakeOver(ctx context.Context, id idempotency.ID, from, to string, now, until time.Time) (bool, error) {
	y.pause(ctx)
	if y.stored(ctx, id) {
		return false, errStored5xx
	}
	ok, err := y.Store.TakeOver(ctx, id, from, to, now, until)
	if ok && err == nil {
		// Another worker of this key may still charge: a server that
		// stores its 500s must not store this one's.
		stateOf(ctx).tookOver = true
	}
	return ok, err
}

// Complete stores a new charge's answer as the 303 the server sends.
func (y *yieldStore) Complete(ctx context.Context, id idempotency.ID, owner string, resp *idempotency.Response, commit func(context.Context) error) error {
	y.pause(ctx)
	if y.fail(ctx, "complete") {
		return errStoreDown
	}
	if resp != nil && resp.StatusCode == http.StatusCreated {
		loc := resp.Header.Get("Location")
		stable := strings.TrimPrefix(loc, "/payments/")
		see, drawn := y.s.seeOthers[stable]
		if !drawn {
			see = y.s.seeOther.Inject(fault.Op{}).Has(seeOther)
			y.s.seeOthers[stable] = see
		}
		if see {
			resp = &idempotency.Response{StatusCode: http.StatusSeeOther, Header: http.Header{"Location": {loc}}}
		}
	}
	return y.Store.Complete(ctx, id, owner, resp, commit)
}

func (y *yieldStore) Release(ctx context.Context, id idempotency.ID, owner string) error {
	y.pause(ctx)
	return y.Store.Release(ctx, id, owner)
}

// Get is the lookup a middleware that looks a key up before inserting it
// would make; it pauses like every other step.
func (y *yieldStore) Get(ctx context.Context, id idempotency.ID, now time.Time) (*idempotency.Record, bool) {
	y.pause(ctx)
	g, ok := y.Store.(interface {
		Get(context.Context, idempotency.ID, time.Time) (*idempotency.Record, bool)
	})
	if !ok {
		return nil, false
	}
	return g.Get(ctx, id, now)
}
