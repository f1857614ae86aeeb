package fakeserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/idempotency"
)

// FaultKind names a fault. The names are those of the admin endpoint.
// It is package fault's Kind.
type FaultKind = fault.Kind

// The faults of the contract (section 9). Package fault documents each.
const (
	// FaultDropResponse does the work and commits, then closes the
	// connection without answering: the lost response.
	FaultDropResponse = fault.LoseAnswer
	// FaultDelay holds the work for Fault.Delay before committing.
	FaultDelay = fault.Delay
	// FaultCrashAfterInsert inserts the IN_PROGRESS record, then closes the
	// connection and leaves the record behind, as a dead worker would.
	FaultCrashAfterInsert = fault.CrashAfterInsert
	// FaultCrashAfterProvider charges the provider, then dies before
	// recording anything.
	FaultCrashAfterProvider = fault.CrashAfterProvider
	// FaultError fails inside the work, after the record is inserted and
	// before the effect commits: 500, rolled back, the key free again.
	FaultError = fault.Error
	// FaultStatus answers Fault.Status (with Retry-After: Fault.RetryAfter
	// if set) and touches nothing, as a proxy in front of the server would.
	FaultStatus = fault.Status
	// FaultReset closes the connection before reading the request.
	FaultReset = fault.Reset
)

// faultKinds lists every fault, in the order of the contract.
var faultKinds = []FaultKind{FaultDropResponse, FaultDelay, FaultCrashAfterInsert, FaultCrashAfterProvider,
	FaultError, FaultStatus, FaultReset}

func validFaultNames() string {
	names := make([]string, len(faultKinds))
	for i, k := range faultKinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

var (
	// errUnknownFault is wrapped by [Handler.InjectFault] errors for a
	// FaultKind that does not exist; the message lists the valid ones.
	errUnknownFault = errors.New("fakeserver: unknown fault")
	// errInvalidFault is wrapped by [Handler.InjectFault] errors for a fault
	// whose fields are wrong; the message says which.
	errInvalidFault = errors.New("fakeserver: invalid fault")
	// ErrTooManyFaults is returned by [Handler.InjectFault] when 100 faults
	// are pending: clear them ([Handler.ClearFaults]) to inject more.
	ErrTooManyFaults = errors.New("fakeserver: too many faults pending; clear them first")
)

// maxFaults is how many injected faults may be pending at once.
const maxFaults = 100

// maxFaultPath bounds Fault.Path.
const maxFaultPath = 2048

// maxFaultCaller bounds Fault.Caller.
const maxFaultCaller = 4096

// Fault is a fault to inject. It applies to the next Count requests that
// match Key and Path; a zero Key or Path matches any. Admin endpoints
// (/_fake/...) are never faulted. A Fault is a value.
type Fault struct {
	Kind FaultKind
	// Key matches requests with this Idempotency-Key, bare or quoted alike.
	Key string
	// Caller matches the requests of one caller: give its Authorization
	// value. A test token stands for its account's every token. A key is
	// its caller's, so name the caller with the key. Empty matches all.
	Caller string
	// Path matches requests with exactly this URL path, such as "/payments".
	Path string
	// Count is how many matching requests the fault applies to. Zero means 1.
	Count int
	// Delay is the delay of FaultDelay; it must be positive for it.
	Delay time.Duration
	// Status is the status of FaultStatus, 200-599; required for it.
	Status int
	// RetryAfter is the Retry-After value FaultStatus sends, if not empty:
	// delta-seconds or an HTTP-date.
	RetryAfter string
}

// validate checks f and returns it normalised.
func (f Fault) validate() (Fault, error) {
	known := false
	for _, k := range faultKinds {
		known = known || f.Kind == k
	}
	if !known {
		return f, fmt.Errorf("%w %q (valid faults: %s)", errUnknownFault, f.Kind, validFaultNames())
	}
	if f.Key != "" {
		key, err := idempotency.ParseKey(f.Key)
		if err != nil {
			return f, fmt.Errorf("%w: key: %v", errInvalidFault, err)
		}
		f.Key = key
	}
	switch {
	case f.Path != "" && f.Path[0] != '/':
		return f, fmt.Errorf("%w: path %q must start with /", errInvalidFault, f.Path)
	case len(f.Path) > maxFaultPath:
		return f, fmt.Errorf("%w: path is longer than %d bytes", errInvalidFault, maxFaultPath)
	case strings.ContainsAny(f.Path, "?#"):
		return f, fmt.Errorf("%w: path %q has a query or fragment; give the path alone, such as /payments "+
			"(a rule's fault.Query matches a query)", errInvalidFault, f.Path)
	case strings.Contains(f.Path, "%"):
		return f, fmt.Errorf("%w: path %q is escaped; requests match on the decoded path, so write it decoded", errInvalidFault, f.Path)
	case f.Path == strings.TrimSuffix(adminPrefix, "/") || strings.HasPrefix(f.Path, adminPrefix):
		return f, fmt.Errorf("%w: path %q is an admin endpoint, which is never faulted", errInvalidFault, f.Path)
	case f.Count < 0:
		return f, fmt.Errorf("%w: count %d is negative", errInvalidFault, f.Count)
	case f.Delay < 0:
		return f, fmt.Errorf("%w: delay %v is negative", errInvalidFault, f.Delay)
	case f.Kind == FaultDelay && f.Delay == 0:
		return f, fmt.Errorf("%w: the delay fault needs a positive delay (delay_ms)", errInvalidFault)
	case f.Kind == FaultStatus && (f.Status < 200 || f.Status > 599):
		return f, fmt.Errorf("%w: the status fault needs a status from 200 to 599, not %d", errInvalidFault, f.Status)
	case f.Kind != FaultStatus && f.Status != 0:
		return f, fmt.Errorf("%w: status is only for the status fault", errInvalidFault)
	case f.Kind != FaultDelay && f.Delay != 0:
		return f, fmt.Errorf("%w: the delay (delay_ms) is only for the delay fault; the %s fault never waits", errInvalidFault, f.Kind)
	case f.Kind != FaultStatus && f.RetryAfter != "":
		return f, fmt.Errorf("%w: retry_after is only for the status fault", errInvalidFault)
	case len(f.Caller) > maxFaultCaller:
		return f, fmt.Errorf("%w: caller is longer than %d bytes", errInvalidFault, maxFaultCaller)
	case len(f.RetryAfter) > 64:
		return f, fmt.Errorf("%w: retry_after is longer than 64 characters", errInvalidFault)
	}
	for i := 0; i < len(f.Caller); i++ {
		if c := f.Caller[i]; c < 0x20 || c > 0x7e {
			return f, fmt.Errorf("%w: caller may hold only printable ASCII, as an Authorization value", errInvalidFault)
		}
	}
	for i := 0; i < len(f.RetryAfter); i++ {
		if c := f.RetryAfter[i]; c < 0x20 || c > 0x7e {
			return f, fmt.Errorf("%w: retry_after may hold only printable ASCII", errInvalidFault)
		}
	}
	if f.Count == 0 {
		f.Count = 1
	}
	return f, nil
}

// rule returns the rule of f, a valid Fault.
func (f Fault) rule() *fault.Rule {
	var when []fault.Predicate
	if f.Key != "" {
		when = append(when, fault.Key(f.Key))
	}
	if f.Caller != "" {
		when = append(when, fault.Caller(callerOf(f.Caller)))
	}
	if f.Path != "" {
		when = append(when, fault.Path(f.Path))
	}
	return &fault.Rule{When: fault.And(when...), Times: f.Count, Effect: fault.Effect{Kind: f.Kind, Delay: f.Delay,
		Status: f.Status, RetryAfter: f.RetryAfter}}
}

// checkRule checks a rule given to InjectRule. A rule that draws its
// effect is checked as it strikes (see validEffects).
func checkRule(r *fault.Rule) error {
	if r == nil {
		return fmt.Errorf("%w: the rule is nil", errInvalidFault)
	}
	if r.Times < 0 {
		return fmt.Errorf("%w: times %d is negative; give a count, or 0 for no limit", errInvalidFault, r.Times)
	}
	if r.Draw != nil {
		return nil
	}
	return checkEffect(r.Effect)
}

// checkEffect checks e as a Fault of its kind.
func checkEffect(e fault.Effect) error {
	_, err := Fault{Kind: e.Kind, Delay: e.Delay, Status: e.Status, RetryAfter: e.RetryAfter}.validate()
	return err
}

// validEffects drops the effects that are not valid faults here. Only a
// drawn effect can be one, and the server cannot apply it.
func (h *Handler) validEffects(es fault.Effects) fault.Effects {
	kept := es[:0]
	for _, e := range es {
		if checkEffect(e) == nil && h.checkDelay(e) == nil {
			kept = append(kept, e)
		}
	}
	return kept
}

// attempts numbers the requests of each method from 1: Op.Attempt.
// So GETs between POSTs never shift the POSTs' numbers. Methods beyond
// the standard ones share one count, which bounds the map.
type attempts struct {
	mu sync.Mutex
	n  map[string]int
}

var countedMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions}

func (a *attempts) next(method string) int {
	if !slices.Contains(countedMethods, method) {
		method = "" // any other method
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = make(map[string]int)
	}
	a.n[method]++
	return a.n[method]
}

// reset numbers from 1 again, as POST /_fake/reset forgets the counts.
func (a *attempts) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.n)
}

type faultCtxKey struct{}

// faultsFrom returns the effects the request's faults ask of the work.
func faultsFrom(ctx context.Context) fault.Effects {
	es, _ := ctx.Value(faultCtxKey{}).(fault.Effects)
	return es
}

// prepare checks f for this server and returns it normalised. Under
// RequireUUID its key takes the canonical form the server compares.
func (h *Handler) prepare(f Fault) (Fault, error) {
	f, err := f.validate()
	if err != nil {
		return f, err
	}
	f.Key = idempotency.CanonicalKey(f.Key, h.cfg.uuid)
	return f, h.checkDelay(f.rule().Effect)
}

// checkDelay refuses a delay fault that outlasts the lease, with
// ProcessingDelay. A worker still waiting would be taken over by its
// resend. The work would then run twice under one key.
func (h *Handler) checkDelay(e fault.Effect) error {
	if e.Kind == FaultDelay && h.cfg.delay+e.Delay >= h.cfg.lease {
		return fmt.Errorf("%w: the delay (%v) plus ProcessingDelay (%v) must be shorter than the lease (%v); "+
			"a longer wait lets the resend take the work over and run it twice", errInvalidFault, e.Delay, h.cfg.delay, h.cfg.lease)
	}
	return nil
}

// holdWork holds the work for d. A worker whose lease ended meanwhile
// dies before the work, as a dead worker would. Its record may be a
// takeover's now, so its work would run twice.
func (h *Handler) holdWork(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	info, keyed := idempotency.FromContext(ctx)
	var held *idempotency.Record
	if keyed {
		rec, live, err := h.state.Record(ctx, info.ID, h.cfg.now())
		if err == nil && live {
			held = rec
		}
	}
	if err := h.wait(ctx, d); err != nil {
		return err
	}
	if held != nil && !h.stillLeased(ctx, held) {
		panic(http.ErrAbortHandler) // the lease ended; the record stays for the takeover
	}
	return nil
}

// stillLeased reports whether held's lease is alive and untaken. A lease
// ended, taken over or unreadable is lost.
func (h *Handler) stillLeased(ctx context.Context, held *idempotency.Record) bool {
	rec, live, err := h.state.Record(ctx, held.ID, h.cfg.now())
	if err != nil || !live || rec.Status != idempotency.StatusInProgress || !rec.LockedUntil.Equal(held.LockedUntil) {
		return false
	}
	at := h.cfg.now()
	if !rec.ReadAt.IsZero() {
		at = rec.ReadAt // the store's clock judges its leases
	}
	return at.Before(rec.LockedUntil)
}

// delayOf returns how long the delay fault holds the work.
func delayOf(es fault.Effects) time.Duration {
	e, _ := es.Get(FaultDelay)
	return e.Delay
}

// discard is the ResponseWriter of a request whose response will be dropped:
// the work runs and commits, and nothing reaches the client.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }

// resetConn closes the connection without reading the request. Where the
// connection cannot be hijacked, aborting the handler closes it too.
func resetConn(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
