package fakeserver

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// Handler is the fake server as a bare http.Handler, for users who mount it
// themselves. It holds all state: records, payments, provider charges,
// faults and counters. A Handler is safe for concurrent use by multiple
// goroutines.
type Handler struct {
	cfg      config
	store    *idempotency.MemoryStore
	ledger   *ledger
	provider *provider
	orders   orders
	faults   faultSet
	payments http.Handler // POST /payments: the business handler behind the idempotency layer
	pg       *pgState     // the state in PostgreSQL; nil when in memory
	instance string       // tells this process's payment ids from others' on one database

	requests, executions, seq atomic.Int64

	// life bounds the work of every request and sweep: Abort cancels it.
	// It is the handler's lifetime, not a request's.
	life  context.Context
	abort context.CancelFunc
}

// NewHandler returns a fake server handler. nil opts means defaults.
func NewHandler(opts *Options) *Handler {
	return newHandler(opts, false)
}

// newHandler builds a Handler; bare mounts the payment handler without the
// idempotency layer, for the benchmark's baseline.
func newHandler(opts *Options, bare bool) *Handler {
	h := &Handler{
		cfg:      opts.config(),
		store:    idempotency.NewMemoryStore(),
		ledger:   newLedger(),
		provider: newProvider(),
		orders:   orders{status: make(map[idempotency.ID]string)},
	}
	h.life, h.abort = context.WithCancel(context.Background())
	var store idempotency.Store = h.store
	if h.cfg.pg != nil {
		// The bounds on memory do not apply: the database holds the state.
		h.pg = newPGState(h.cfg.pg, h.cfg.clock)
		h.instance = strings.ToLower(rand.Text()[:8])
		// The middleware saves a finished request's outcome even when its
		// client has gone; Abort still ends that work.
		store = abortable{Store: h.pg.store, h: h}
	} else {
		h.store.SetMaxRecords(h.cfg.maxRecords)
		h.store.SetClock(h.cfg.clock) // nil: the system clock, as h.cfg.now
		h.ledger.max = h.cfg.maxPayments
	}
	h.payments = http.HandlerFunc(h.createPayment)
	if !bare {
		h.payments = idempotency.New(h.payments, idempotency.Config{
			Store:       store,
			Clock:       h.cfg.clock,
			Retention:   h.cfg.retention,
			Lease:       h.cfg.lease,
			Expected:    h.cfg.delay,
			RequireUUID: h.cfg.uuid,
			Validate:    validatePayment,
			Principal:   principalOf,
			NewStableID: h.newPaymentID,
			OnOutcome:   setOutcome,
			Logger:      h.cfg.logger,
		})
	}
	return h
}

// InjectFault adds a fault. It fails, changing nothing, when f.Kind is not a
// fault (the error lists the valid ones), a field is out of range, or
// [MaxFaults] faults are pending ([ErrTooManyFaults]).
func (h *Handler) InjectFault(f Fault) error {
	f, err := f.validate()
	if err != nil {
		return err
	}
	return h.faults.add(f)
}

// Abort ends the database work of every request in flight, and of every
// later request and sweep: each statement is cancelled, and a request that
// had not committed its payment commits nothing (its record stays, for a
// resend to take over). A program calls it when its drain time is over and
// it closes its connections anyway, so that a commit waiting on a lock
// neither keeps it running nor lands after it stopped; then it closes the
// pool, which waits only for the cancelled statements. In memory it only
// makes later sweeps do nothing. Abort cannot be undone.
func (h *Handler) Abort() { h.abort() }

// bound returns ctx, cancelled also by Abort.
func (h *Handler) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(h.life, cancel)
	return ctx, func() { stop(); cancel() }
}

// abortable is a Store whose every call ends when the handler is aborted.
type abortable struct {
	idempotency.Store
	h *Handler
}

func (a abortable) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	ctx, cancel := a.h.bound(ctx)
	defer cancel()
	return a.Store.Insert(ctx, rec)
}

func (a abortable) TakeOver(ctx context.Context, id idempotency.ID, from, to string, now, until time.Time) (bool, error) {
	ctx, cancel := a.h.bound(ctx)
	defer cancel()
	return a.Store.TakeOver(ctx, id, from, to, now, until)
}

func (a abortable) Complete(ctx context.Context, id idempotency.ID, owner string, resp *idempotency.Response, commit func(context.Context) error) error {
	ctx, cancel := a.h.bound(ctx)
	defer cancel()
	return a.Store.Complete(ctx, id, owner, resp, commit)
}

func (a abortable) Release(ctx context.Context, id idempotency.ID, owner string) error {
	ctx, cancel := a.h.bound(ctx)
	defer cancel()
	return a.Store.Release(ctx, id, owner)
}

func (a abortable) Sweep(ctx context.Context, now time.Time) (int, error) {
	ctx, cancel := a.h.bound(ctx)
	defer cancel()
	return a.Store.Sweep(ctx, now)
}

// ClearFaults removes every injected fault.
func (h *Handler) ClearFaults() { h.faults.clear() }

// Sweep deletes the records expired by the Clock and returns how many.
// A payment whose worker died and was never taken over is settled as its
// record goes: recorded if the provider charged it, its room freed if not.
func (h *Handler) Sweep() int {
	ctx := h.life
	now := h.cfg.now()
	var n int
	if h.pg != nil {
		// The records go, but not before the charges of their dead
		// workers are payments.
		if err := h.pg.recoverExpired(ctx); err != nil {
			return 0
		}
		n, _ = h.pg.store.Sweep(ctx, now)
	} else {
		n, _ = h.store.Sweep(ctx, now)
	}
	_ = h.settleReservations(ctx, func(id idempotency.ID, stableID string) bool {
		rec, ok, err := h.liveRecord(ctx, id, now)
		return err == nil && (!ok || rec.StableID != stableID)
	}, true)
	return n
}

// settleReservations records as payments the reservations that pick
// selects whose charge the provider made, and frees the others if free is
// true. It is for reservations no worker can settle any more.
func (h *Handler) settleReservations(ctx context.Context, pick func(rec idempotency.ID, id string) bool, free bool) error {
	for pid, r := range h.ledger.reservations(pick) {
		ch, charged, err := h.lookupCharge(ctx, pid)
		if err != nil {
			return err
		}
		if charged {
			if err := h.addPayment(ctx, r.payment(pid, ch)); err != nil {
				return err
			}
		}
		if charged || free {
			h.ledger.unreserve(pid)
		}
	}
	return nil
}

// recoverCharged returns the payment made under record id once no request
// can settle the record any more (it is done, expired or gone), recording
// first what the provider charged for it under a worker that died. It
// reports false when there is none. The payments are read after the
// record: a worker records its payment before its record is done. On
// PostgreSQL the intent is the key's latest row of fake_intents, whichever
// process wrote it.
func (h *Handler) recoverCharged(ctx context.Context, id idempotency.ID) (*payment, bool, error) {
	rec, ok, err := h.liveRecord(ctx, id, h.cfg.now())
	if err != nil || ok && rec.Status == idempotency.StatusInProgress {
		return nil, false, err // a resend with the key takes it over and settles it
	}
	if h.pg != nil {
		return h.pg.recoverLatest(ctx, id)
	}
	if err := h.settleReservations(ctx, func(rec idempotency.ID, _ string) bool { return rec == id }, false); err != nil {
		return nil, false, err
	}
	return h.findPaymentByKey(ctx, id.Principal, id.Key)
}

// Reset forgets everything: records, payments, provider charges, orders,
// faults and counters. Requests in flight may still commit afterwards.
// On PostgreSQL it empties the shared tables, for every process on the
// database; faults are forgotten in this process only.
func (h *Handler) Reset() { _ = h.reset(context.Background()) }

func (h *Handler) reset(ctx context.Context) error {
	h.faults.clear()
	var err error
	if h.pg != nil {
		err = h.pg.reset(ctx)
	}
	h.store.Clear()
	h.ledger.reset()
	h.provider.reset()
	h.orders.mu.Lock()
	clear(h.orders.status)
	h.orders.mu.Unlock()
	h.requests.Store(0)
	h.executions.Store(0)
	return err
}

// RunSweeper calls Sweep every interval (real time) until ctx is done.
func (h *Handler) RunSweeper(ctx context.Context, every time.Duration) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.Sweep()
		}
	}
}

// ServeHTTP implements http.Handler: admin endpoints, faults, then the
// business API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, AdminPrefix) {
		h.serveAdmin(w, r)
		return
	}
	ctx, cancel := h.bound(r.Context())
	defer cancel()
	r = r.WithContext(ctx)
	h.countRequest(ctx)

	var entry *logEntry
	if h.cfg.logger != nil {
		entry = &logEntry{start: time.Now()}
		r = r.WithContext(context.WithValue(r.Context(), logCtxKey{}, entry))
		lw := &statusWriter{ResponseWriter: w}
		w = lw
		defer func() {
			if v := recover(); v != nil {
				if entry.outcome == "" {
					entry.outcome = "aborted"
				}
				h.log(r, entry, 0)
				panic(v)
			}
			h.log(r, entry, lw.status)
		}()
	}

	f := h.faults.match(requestKey(r), r.URL.Path)
	if f != nil {
		switch {
		case f.has(FaultReset):
			entry.set("fault_reset")
			resetConn(unwrap(w))
			return
		case f.has(FaultStatus):
			entry.set("fault_status")
			if f.retryAfter != "" {
				w.Header().Set("Retry-After", f.retryAfter)
			}
			(&problem{Type: ProblemInjectedFault, Title: http.StatusText(f.status), Status: f.status,
				Detail: "the status fault answered this request; nothing was done"}).Write(w)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), faultCtxKey{}, f))
		if f.has(FaultDropResponse) {
			h.route(&discard{h: make(http.Header)}, r)
			entry.set("dropped")
			panic(http.ErrAbortHandler) // close the connection without answering
		}
	}
	h.route(w, r)
}

// route dispatches the business API.
func (h *Handler) route(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch {
	case path == "/payments":
		switch r.Method {
		case http.MethodPost:
			h.payments.ServeHTTP(w, r)
		case http.MethodGet, http.MethodHead:
			if q := r.URL.Query(); q.Has("idempotency_key") {
				// The lookup marks every answer as the server's own: the
				// key echoed as received, and no cache may keep it (a
				// replayed "not found" could void a payment made since).
				w.Header()["Idempotency-Key"] = []string{q.Get("idempotency_key")}
				w.Header().Set("Cache-Control", "no-store")
			}
			h.simpleFaults(w, r, h.listPayments)
		default:
			methodNotAllowed(w, "GET, HEAD, POST")
		}
	case strings.HasPrefix(path, "/payments/"):
		id := strings.TrimPrefix(path, "/payments/")
		if id == "" || strings.Contains(id, "/") {
			notFound("no such resource: " + path).Write(w)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET, HEAD")
			return
		}
		h.simpleFaults(w, r, func(w http.ResponseWriter, r *http.Request) { h.getPayment(w, r, id) })
	case strings.HasPrefix(path, "/orders/") && strings.HasSuffix(path, "/status"):
		id := strings.TrimSuffix(strings.TrimPrefix(path, "/orders/"), "/status")
		if id == "" || strings.Contains(id, "/") {
			notFound("no such resource: " + path).Write(w)
			return
		}
		if r.Method != http.MethodPut {
			methodNotAllowed(w, "PUT")
			return
		}
		h.putOrderStatus(w, r, id)
	default:
		notFound("no such resource: " + path + "; the API has /payments, /payments/{id} and /orders/{id}/status").Write(w)
	}
}

// simpleFaults applies the in-work faults to a read-only endpoint, which has
// no record and no provider: delay waits, error answers 500, the crashes
// close the connection.
func (h *Handler) simpleFaults(w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	f := faultsFrom(r.Context())
	if err := sleep(r.Context(), f.delay); err != nil {
		return
	}
	switch {
	case f.has(FaultCrashAfterInsert), f.has(FaultCrashAfterProvider):
		panic(http.ErrAbortHandler)
	case f.has(FaultError):
		(&problem{Type: ProblemInjectedFault, Title: "Injected error", Status: http.StatusInternalServerError,
			Detail: "the error fault failed this request"}).Write(w)
		return
	}
	next(w, r)
}

// requestKey is the request's key as faults match it: parsed when valid,
// raw otherwise.
func requestKey(r *http.Request) string {
	v := r.Header.Get(idempotency.HeaderKey)
	if k, err := idempotency.ParseKey(v); err == nil {
		return k
	}
	return v
}

// logEntry collects what the request's log line reports.
type logEntry struct {
	start   time.Time
	outcome string
}

type logCtxKey struct{}

func (e *logEntry) set(outcome string) {
	if e != nil {
		e.outcome = outcome
	}
}

// setOutcome is the middleware's OnOutcome hook.
func setOutcome(r *http.Request, o idempotency.Outcome) {
	if e, ok := r.Context().Value(logCtxKey{}).(*logEntry); ok {
		e.set(string(o))
	}
}

func (h *Handler) log(r *http.Request, e *logEntry, status int) {
	outcome := e.outcome
	if outcome == "" {
		outcome = "served"
	}
	h.cfg.logger.LogAttrs(r.Context(), slog.LevelInfo, "request",
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.String("key", r.Header.Get(idempotency.HeaderKey)),
		slog.Int("status", status),
		slog.String("outcome", outcome),
		slog.Duration("duration", time.Since(e.start)))
}

// statusWriter remembers the status for the log line.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func unwrap(w http.ResponseWriter) http.ResponseWriter {
	if sw, ok := w.(*statusWriter); ok {
		return sw.ResponseWriter
	}
	return w
}
