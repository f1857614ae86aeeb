package fakeserver

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/idemkit/idem/fakeserver/internal/fakestate"
	"github.com/idemkit/idem/idempotency"
)

// Endpoint is an endpoint of the app's own API that the fake server serves
// beside its payments. It is the handler the app's server runs, or a fake
// of it. It sits behind the same idempotency layer as POST /payments. It
// has the same faults, counters, log and admin endpoints. A test of the
// app's client then sees the contract's answers on the app's own paths.
// It sees the faults it injects there too.
type Endpoint struct {
	// Pattern is a net/http.ServeMux pattern with a method, such as
	// "POST /orders" or "POST /orders/{id}/refunds". The handler reads
	// the wildcards with r.PathValue. A POST or PATCH endpoint requires
	// an Idempotency-Key. It runs behind the idempotency layer, as
	// /payments does. One of any other method is served as it is, with
	// the faults. The paths of the fake's own API are refused: /payments
	// and /_fake/, and below them.
	Pattern string
	// Handler does the work. Behind the layer it runs once per intent. A
	// retry of a completed request gets the stored answer, byte for byte,
	// without running it. It may read idempotency.FromContext for the
	// intent's stable id. It must check Info.Takeover, as a production
	// handler must. A worker may die, as the crash faults make it. The
	// request that takes its record over runs Handler again, with the same
	// stable id. An answer of 500 or more stores nothing, and frees the
	// key.
	Handler http.Handler
	// Validate, if not nil, checks a POST or PATCH request's body before
	// its key is looked at, as idempotency.Config.Validate does. A
	// non-nil Problem is the answer, and nothing is stored. Pass the
	// production server's own.
	Validate func(r *http.Request, body []byte) (parsed any, p *idempotency.Problem)
}

// keyed reports whether an endpoint of method runs behind the layer.
func keyed(method string) bool { return method == http.MethodPost || method == http.MethodPatch }

// mountEndpoints builds the mux of the app's endpoints. It panics on a
// pattern it cannot serve, naming it. The constructors panic so on other
// settings that cannot work.
func (h *Handler) mountEndpoints(eps []Endpoint) {
	if len(eps) == 0 {
		return
	}
	h.endpoints = http.NewServeMux()
	for _, ep := range eps {
		method, rest, ok := strings.Cut(strings.TrimSpace(ep.Pattern), " ")
		path := strings.TrimSpace(rest)
		if i := strings.IndexByte(path, '/'); i > 0 {
			path = path[i:] // the pattern names a host: the path follows it
		}
		switch {
		case !ok || strings.HasPrefix(method, "/"):
			panic(fmt.Sprintf("fakeserver: Endpoint pattern %q needs a method and a path, such as \"POST /orders\"", ep.Pattern))
		case ep.Handler == nil:
			panic(fmt.Sprintf("fakeserver: Endpoint %q has no Handler", ep.Pattern))
		case path == "/payments" || strings.HasPrefix(path, "/payments/") || path == "/_fake" || strings.HasPrefix(path, adminPrefix):
			panic(fmt.Sprintf("fakeserver: Endpoint %q is on the fake's own API (/payments, /_fake/); choose another path", ep.Pattern))
		}
		var next http.Handler
		if keyed(method) {
			next = idempotency.New(h.work(ep.Handler), idempotency.Config{
				Store:        h.state.Records(),
				Clock:        h.cfg.clock,
				Retention:    h.cfg.retention,
				Lease:        h.cfg.lease,
				Expected:     h.cfg.delay,
				RequireUUID:  h.cfg.uuid,
				MaxBodyBytes: maxBodyBytes,
				Validate:     ep.Validate,
				Principal:    principalOf,
				OnOutcome:    setOutcome,
				Logger:       h.cfg.logger,
			})
		} else {
			handler := ep.Handler
			next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.simpleFaults(w, r, handler.ServeHTTP)
			})
		}
		h.endpoints.Handle(ep.Pattern, next) // panics on a malformed or duplicate pattern, naming it
		if !slices.Contains(h.endpointMethods, method) {
			h.endpointMethods = append(h.endpointMethods, method)
		}
	}
}

// serveEndpoint serves r with the app's endpoint whose pattern matches it,
// and reports false when none does.
func (h *Handler) serveEndpoint(w http.ResponseWriter, r *http.Request) bool {
	if h.endpoints == nil {
		return false
	}
	if _, pattern := h.endpoints.Handler(r); pattern == "" {
		return false
	}
	h.endpoints.ServeHTTP(w, r)
	return true
}

// endpointNotAllowed answers 405 to a request on an endpoint's path in
// another method. The answer names the methods the path has. It reports
// false when no endpoint has the path.
func (h *Handler) endpointNotAllowed(w http.ResponseWriter, r *http.Request) bool {
	var allow []string
	for _, m := range h.endpointMethods {
		probe := *r
		probe.Method = m
		if _, pattern := h.endpoints.Handler(&probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		return false
	}
	methodNotAllowed(w, strings.Join(allow, ", "))
	return true
}

// work runs an endpoint's handler behind the layer with the in-work
// faults. They strike at the points they have for a payment.
// crash_after_insert dies before the work. delay holds it. error fails
// it with nothing done. crash_after_provider does the work and dies
// before its answer is recorded.
func (h *Handler) work(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		f := faultsFrom(ctx)
		if f.Has(FaultCrashAfterInsert) {
			panic(http.ErrAbortHandler) // the worker dies; the IN_PROGRESS record stays
		}
		if err := h.holdWork(ctx, h.cfg.delay+delayOf(f)); err != nil {
			idempotency.NothingDone(ctx)
			(&problem{Type: problemUnavailable, Title: "Client went away", Status: http.StatusServiceUnavailable,
				Detail: "the request was cancelled before the work was done; nothing was done"}).Write(w)
			return
		}
		if err := h.state.Count(ctx, fakestate.Executions); err != nil {
			h.internalError(w, r, err)
			return
		}
		if f.Has(FaultError) {
			idempotency.NothingDone(ctx)
			(&problem{Type: problemInjectedFault, Title: "Injected error", Status: http.StatusInternalServerError,
				Detail: "the error fault failed this request before the work was done; nothing was done"}).Write(w)
			return
		}
		if f.Has(FaultCrashAfterProvider) {
			next.ServeHTTP(&discard{h: make(http.Header)}, r)
			panic(http.ErrAbortHandler) // done, but nothing recorded
		}
		next.ServeHTTP(w, r)
	})
}
