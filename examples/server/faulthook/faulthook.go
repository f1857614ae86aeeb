// Package faulthook lets idemcheck (cmd/idemcheck) make a server built on
// idem's middleware fail on purpose, so that its fault rows
// (5xx-not-stored, dead-worker) and the held request of its concurrent row
// run against the real server, not only against the fake one.
//
// The hook speaks the fake server's admin protocol (docs/IDEMCHECK.md,
// "The fault hook"): POST {base}faults arms a fault for one
// Idempotency-Key, GET {base}stats counts the server's effects. A server
// wraps its handler with [Hook.Wrap], inside idempotency.New, and serves
// the Hook itself on an address of its own that clients cannot reach.
//
// It is off unless the server turns it on: a server without it has no
// way to be made to fail. Anyone who reaches the hook's address can fail
// requests and read the counts, so it belongs on loopback or a test
// network, never on a public address.
package faulthook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// The faults a Hook arms, by the names of the fake server's admin
// endpoint.
const (
	// Error fails the work after the handler ran: the answer is a 500, so
	// the middleware drops the handler's effect and stores nothing.
	Error = "error"
	// CrashAfterProvider lets the handler's effect run, then kills the
	// worker before its commit: the request gets no answer, as when the
	// process dies (panic with http.ErrAbortHandler).
	CrashAfterProvider = "crash_after_provider"
	// Delay holds the work for delay_ms before the handler runs.
	Delay = "delay"
)

// Bounds on what the hook's clients can make it keep or do.
const (
	// MaxPending is how many armed faults may wait for their request.
	MaxPending = 100
	// MaxDelay bounds a delay fault.
	MaxDelay = 10 * time.Second
	// maxBody bounds the body of POST faults.
	maxBody = 4 << 10
	// maxKey is the longest Idempotency-Key the contract allows.
	maxKey = 255
)

// Stats are the counts that GET stats answers. The dead-worker row checks
// that a dead worker's retry did the work once: one payment, one charge.
type Stats struct {
	// Payments is how many payments the server has made.
	Payments int `json:"payments"`
	// ProviderCharges is how many charges an outside provider has made.
	// A server whose only effect is its own database row counts that.
	ProviderCharges int `json:"provider_charges"`
}

// A Hook holds the armed faults. It is safe for concurrent use.
type Hook struct {
	stats func(context.Context) (Stats, error)

	mu    sync.Mutex
	armed map[string]armed // by the key as the middleware compares it
}

type armed struct {
	kind  string
	delay time.Duration
}

// New returns a Hook whose GET stats answers what stats counts.
func New(stats func(context.Context) (Stats, error)) *Hook {
	return &Hook{stats: stats, armed: map[string]armed{}}
}

// fault is the body of POST faults.
type fault struct {
	Fault   string `json:"fault"`
	Key     string `json:"key"`
	DelayMS int64  `json:"delay_ms"`
}

// ServeHTTP serves the hook: POST /faults arms a fault (201), GET /stats
// answers the counts. The paths are the last element of the URL, so the
// hook may be mounted under any prefix.
func (h *Hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && pathEnds(r, "/faults"):
		h.arm(w, r)
	case r.Method == http.MethodGet && pathEnds(r, "/stats"):
		st, err := h.stats(r.Context())
		if err != nil {
			http.Error(w, "the counts cannot be read", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	default:
		http.Error(w, "the fault hook has POST faults and GET stats", http.StatusNotFound)
	}
}

func pathEnds(r *http.Request, suffix string) bool {
	p := r.URL.Path
	return len(p) >= len(suffix) && p[len(p)-len(suffix):] == suffix
}

func (h *Hook) arm(w http.ResponseWriter, r *http.Request) {
	var f fault
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		http.Error(w, "the body is not a fault: "+err.Error(), http.StatusBadRequest)
		return
	}
	a, err := check(f)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	full := len(h.armed) >= MaxPending
	if !full {
		h.armed[f.Key] = a
	}
	h.mu.Unlock()
	if full {
		http.Error(w, fmt.Sprintf("%d faults wait for their request already", MaxPending), http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// check validates a fault and returns it armed.
func check(f fault) (armed, error) {
	if f.Key == "" || len(f.Key) > maxKey {
		return armed{}, errors.New("key: give the Idempotency-Key of the request to fail, 1 to 255 characters")
	}
	switch f.Fault {
	case Error, CrashAfterProvider:
		return armed{kind: f.Fault}, nil
	case Delay:
		d := time.Duration(f.DelayMS) * time.Millisecond
		if f.DelayMS <= 0 || d > MaxDelay {
			return armed{}, fmt.Errorf("delay_ms: give 1 to %d", MaxDelay.Milliseconds())
		}
		return armed{kind: Delay, delay: d}, nil
	}
	return armed{}, fmt.Errorf("fault %q: this hook has %s, %s and %s", f.Fault, Error, CrashAfterProvider, Delay)
}

// take removes and returns the fault armed for key.
func (h *Hook) take(key string) (armed, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a, ok := h.armed[key]
	if ok {
		delete(h.armed, key)
	}
	return a, ok
}

// Wrap returns next with the armed faults applied to the requests of
// their keys. It goes inside idempotency.New, which gives it the key:
// the middleware must see the work fail, as it would see a real failure.
func (h *Hook) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := idempotency.FromContext(r.Context())
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		a, ok := h.take(info.ID.Key)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		switch a.kind {
		case Delay:
			t := time.NewTimer(a.delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-r.Context().Done():
				// The client left: a 5xx, so that nothing is stored.
				(&idempotency.Problem{Type: "https://idem.dev/problems/internal-error", Title: "Client gone",
					Status: http.StatusServiceUnavailable, Detail: "the client left while the fault hook held the work"}).Write(w)
				return
			}
			next.ServeHTTP(w, r)
		case Error:
			// The handler does its work, then fails: its effect must not
			// be kept, and the key must stay free.
			next.ServeHTTP(discard{header: http.Header{}}, r)
			(&idempotency.Problem{Type: "https://idem.dev/problems/internal-error", Title: "Injected error",
				Status: http.StatusInternalServerError, Detail: "the fault hook failed this request"}).Write(w)
		case CrashAfterProvider:
			// The handler's effects run, in the order registered, when
			// the middleware commits; this one runs after them and kills
			// the worker before the commit.
			next.ServeHTTP(w, r)
			_ = idempotency.OnCommit(r.Context(), func(context.Context) error {
				panic(http.ErrAbortHandler)
			})
		}
	})
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{ header http.Header }

func (d discard) Header() http.Header         { return d.header }
func (d discard) Write(b []byte) (int, error) { return len(b), nil }
func (d discard) WriteHeader(int)             {}
