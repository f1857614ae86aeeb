package fakeserver

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/fakeserver/internal/fakestate"
	"github.com/idemkit/idem/idempotency"
)

// Handler is the fake server as a bare http.Handler, for users who mount it
// themselves. It holds all state: records, payments, provider charges,
// faults and counters (in memory, or in the [Options.Storage]). A Handler
// is safe for concurrent use by multiple goroutines.
type Handler struct {
	cfg      config
	state    fakestate.State
	faults   fault.List
	requests attempts     // numbers the requests faults see
	payments http.Handler // POST /payments: the business handler behind the idempotency layer
	// endpoints serves Options.Endpoints, the app's own; nil without any.
	endpoints       *http.ServeMux
	endpointMethods []string // the methods of their patterns
	instance        string   // tells this process's payment ids from others' on shared storage

	seq atomic.Int64
}

// NewHandler returns a fake server handler. nil opts means defaults.
func NewHandler(opts *Options) *Handler { return newHandler(opts, false) }

// NewBareHandler returns the fake server's handler with POST /payments
// outside the idempotency layer, as a server without the contract runs
// it: every request does the work and charges, and nothing is replayed.
// It is a benchmark's baseline (cmd/idembench measures what the layer
// costs against it), with the same business handler, faults and counters.
// Never test a client against it: it breaks the contract on purpose.
// nil opts means defaults.
func NewBareHandler(opts *Options) *Handler { return newHandler(opts, true) }

// newHandler returns a fake server handler; bare runs POST /payments
// without the idempotency layer (see NewBareHandler).
func newHandler(opts *Options, bare bool) *Handler {
	h := &Handler{cfg: opts.config()}
	h.faults.Max = maxFaults
	h.faults.Final = []fault.Kind{FaultReset, FaultStatus} // the request goes no further
	if h.cfg.storage != nil {
		// The bounds on memory do not apply: the storage holds the state.
		h.state = h.cfg.storage.open(h.cfg.clock)
		h.instance = strings.ToLower(rand.Text()[:8])
	} else {
		h.state = newMemory(h.cfg)
	}
	h.mountEndpoints(h.cfg.endpoints)
	h.payments = http.HandlerFunc(h.createPayment)
	if !bare {
		records := h.state.Records()
		if h.cfg.wrapRecords != nil {
			records = h.cfg.wrapRecords(records)
		}
		h.payments = idempotency.New(h.payments, idempotency.Config{
			Store:        records,
			Clock:        h.cfg.clock,
			Retention:    h.cfg.retention,
			Lease:        h.cfg.lease,
			Expected:     h.cfg.delay,
			RequireUUID:  h.cfg.uuid,
			MaxBodyBytes: maxBodyBytes,
			Validate:     validatePayment,
			Principal:    principalOf,
			NewStableID:  h.newPaymentID,
			OnOutcome:    setOutcome,
			Logger:       h.cfg.logger,
		})
	}
	return h
}

// InjectFault adds a fault. It fails, changing nothing, when f.Kind is not a
// fault (the error lists the valid ones), a field is out of range, or
// 100 faults are pending ([ErrTooManyFaults]).
func (h *Handler) InjectFault(f Fault) error {
	f, err := h.prepare(f)
	if err != nil {
		return err
	}
	return h.addRule(f.rule())
}

// InjectRule adds a fault made with package fault. Op.Attempt numbers
// the handler's requests of the op's method from 1, admin requests aside.
// Under RequireUUID, Op.Key is the key's canonical form, in lower case.
// Op.Caller is "Bearer test_<account>" for a test token, else the
// Authorization value. The server applies the seven kinds of [Fault].
// It fails, changing nothing, on an effect that is not a valid fault,
// or a negative Times. It fails too while 100 faults are pending
// ([ErrTooManyFaults]). A drawn effect that is not a valid fault is
// dropped as it strikes.
func (h *Handler) InjectRule(r *fault.Rule) error {
	if err := checkRule(r); err != nil {
		return err
	}
	if err := h.checkDelay(r.Effect); err != nil && r.Draw == nil {
		return err
	}
	return h.addRule(r)
}

func (h *Handler) addRule(r *fault.Rule) error {
	if err := h.faults.Add(r); err != nil {
		return ErrTooManyFaults
	}
	return nil
}

// ClearFaults removes every injected fault.
func (h *Handler) ClearFaults() { h.faults.Clear() }

// Sweep deletes the records expired by the Clock and returns how many.
// A payment whose worker died and was never taken over is settled as its
// record goes: recorded if the provider charged it, its room freed if not.
// It returns 0 if the storage failed.
func (h *Handler) Sweep() int {
	n, _ := h.state.Sweep(context.Background(), h.cfg.now())
	return n
}

// recoverCharged returns the payment made under record id once no request
// can settle the record any more (it is done, expired or gone), recording
// first what the provider charged for it under a worker that died. It
// reports false when there is none. The payments are read after the
// record: a worker records its payment before its record is done.
func (h *Handler) recoverCharged(ctx context.Context, id idempotency.ID) (*payment, bool, error) {
	rec, ok, err := h.state.Record(ctx, id, h.cfg.now())
	if err != nil || ok && rec.Status == idempotency.StatusInProgress {
		return nil, false, err // a resend with the key takes it over and settles it
	}
	return h.state.Recover(ctx, id)
}

// reset forgets everything (POST /_fake/reset): records, payments,
// provider charges, orders, faults and counters. Requests in flight may
// still commit afterwards. On shared storage it empties it for every
// server on it; faults are forgotten in this process only.
func (h *Handler) reset(ctx context.Context) error {
	h.faults.Clear()
	h.requests.reset()
	return h.state.Reset(ctx)
}

// runSweeper calls Sweep every interval (real time) until ctx is done.
func (h *Handler) runSweeper(ctx context.Context, every time.Duration) {
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
	if strings.HasPrefix(r.URL.Path, adminPrefix) {
		h.serveAdmin(w, r)
		return
	}
	_ = h.state.Count(r.Context(), fakestate.Requests) // a lost count is no reason to refuse the request

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

	if f := h.faultsOf(r); len(f) > 0 {
		switch {
		case f.Has(FaultReset):
			entry.set("fault_reset")
			resetConn(unwrap(w))
			return
		case f.Has(FaultStatus):
			entry.set("fault_status")
			st, _ := f.Get(FaultStatus)
			writeStatusFault(w, st)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), faultCtxKey{}, f))
		if f.Has(FaultDropResponse) {
			h.route(&discard{h: make(http.Header)}, r)
			entry.set("dropped")
			panic(http.ErrAbortHandler) // close the connection without answering
		}
	}
	h.route(w, r)
}

// writeStatusFault answers as a box in front of the server would. A rule's
// own header and body stand in for the server's problem.
func writeStatusFault(w http.ResponseWriter, st fault.Effect) {
	for k, v := range st.Header {
		w.Header()[k] = append([]string(nil), v...)
	}
	if st.RetryAfter != "" {
		w.Header().Set("Retry-After", st.RetryAfter)
	}
	if st.Header != nil || st.Body != nil {
		w.WriteHeader(st.Status)
		_, _ = w.Write(st.Body)
		return
	}
	(&problem{Type: problemInjectedFault, Title: http.StatusText(st.Status), Status: st.Status,
		Detail: "the status fault answered this request; nothing was done"}).Write(w)
}

// faultsOf returns the effects of the faults that strike r. Without a
// fault it skips parsing r's query.
func (h *Handler) faultsOf(r *http.Request) fault.Effects {
	n := h.requests.next(r.Method)
	if h.faults.Len() == 0 {
		return nil
	}
	op := fault.OpOf(r)
	op.Attempt = n
	op.Key = idempotency.CanonicalKey(op.Key, h.cfg.uuid) // as the server compares it
	op.Caller = principalOf(r)
	return h.validEffects(h.faults.Inject(op))
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
				// key and the lookup's nonce echoed as received, and no
				// cache may keep it (a replayed "not found" could void a
				// payment made since).
				idempotency.MarkLookup(w, r, q.Get("idempotency_key"))
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
	case h.serveEndpoint(w, r):
		// The app's own endpoints come after the fake's payments, so that
		// a wildcard of theirs never takes a payment's request.
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
	case h.endpoints != nil && h.endpointNotAllowed(w, r):
		// Answered 405: an endpoint has the path, in other methods.
	default:
		notFound("no such resource: " + path + "; the API has /payments, /payments/{id} and /orders/{id}/status").Write(w)
	}
}

// simpleFaults applies the in-work faults to a read-only endpoint. Such an
// endpoint has no record and no provider. A delay waits, an error answers
// 500, and the crashes close the connection.
func (h *Handler) simpleFaults(w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	f := faultsFrom(r.Context())
	if err := h.wait(r.Context(), delayOf(f)); err != nil {
		return
	}
	switch {
	case f.Has(FaultCrashAfterInsert), f.Has(FaultCrashAfterProvider):
		panic(http.ErrAbortHandler)
	case f.Has(FaultError):
		(&problem{Type: problemInjectedFault, Title: "Injected error", Status: http.StatusInternalServerError,
			Detail: "the error fault failed this request"}).Write(w)
		return
	}
	next(w, r)
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
func setOutcome(r *http.Request, outcome string) {
	if e, ok := r.Context().Value(logCtxKey{}).(*logEntry); ok {
		e.set(outcome)
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
		slog.String("key", r.Header.Get("Idempotency-Key")),
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
