package idem

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/persist"
)

// Intent is one thing the user means to do, such as paying for this cart.
// It holds one Idempotency-Key for its whole life and the exact request to
// send with it. Client.Send makes and sends one in one call; get one from
// Client.Intent, Client.NewIntent, Client.Load or Client.Unresolved, and
// send it with Client.Settle or Client.Do.
//
// An Intent is safe for concurrent use. Its accessors report the state as
// of the last change made through this process.
type Intent struct {
	mu  sync.Mutex
	rec *persist.Record // guarded by mu; never shared with a store
	// ephemeral intents live only in memory (the RoundTripper's per-request
	// keys); they are never saved.
	ephemeral bool
	// callersKey: an ephemeral intent under a key the caller chose, which
	// the caller may have sent before (its own retry): never provably
	// unsent.
	callersKey bool
	// keys is what the Client that handed the intent out knows of its
	// keys: which intents are provably unsent.
	keys *keys

	// unarmed is set while the intent lives in this process's memory
	// only: made by Intent or NewIntent and not yet handed to Do (the
	// tap). Guarded by mu; armMu serialises the arming.
	unarmed bool
	armMu   sync.Mutex
	// armRoom is memory for the armed version, made with the Intent and
	// used by its arming only (guarded by armMu).
	armRoom *armedVersion
	// force is set for an intent of NewIntent: arming it never adopts
	// another intent of the action with the same request.
	force bool
	// after is the version of the action's latest stored intent when
	// this unarmed intent was made ("" if none): Intent hands it out
	// again only while that is still the latest.
	after string
	// replaced is set when Intent replaced this unarmed intent with one
	// for a changed request: it is never sent.
	replaced bool
}

// Key returns the Idempotency-Key, the same on every attempt.
func (in *Intent) Key() string { return in.current().Key }

// Name returns the action the intent belongs to, as given to Client.Intent.
func (in *Intent) Name() string { return in.current().Name }

// State returns where the intent stands. An intent stored as new reads
// new only while this process knows it was never sent: the Client that
// created it has not sent it (or Intent replaced it unsent). Otherwise,
// after a restart for instance, it reads pending: the first attempt is not
// recorded, so it may have reached the server before a crash.
func (in *Intent) State() persist.State {
	in.mu.Lock()
	rec, unarmed := in.rec, in.unarmed
	in.mu.Unlock()
	if unarmed {
		return persist.StateNew
	}
	if rec.State == persist.StateNew && (in.keys == nil || !in.keys.isUnsent(rec.Key)) {
		return persist.StatePending
	}
	return rec.State
}

// Attempts returns how many attempts have been put on the wire for the
// intent, over all calls and restarts; the first attempt of a call that
// got no answer before a crash may be missing.
func (in *Intent) Attempts() int { return in.current().Attempts }

// UpdatedAt returns when the intent last changed: created, attempted or
// resolved. An app shows "pending for 3 minutes" from it.
func (in *Intent) UpdatedAt() time.Time { return in.current().UpdatedAt }

// CreatedAt returns when the intent's age starts. That is the tap that
// armed it (its first Do or Send), not when Intent or NewIntent made it:
// the server's retention of its key starts no sooner than its first
// attempt. Before the tap it is when the intent was made. An intent that
// ended not sent and is sent again ages from that send, since none began
// before. Its age decides when it may no longer be sent.
func (in *Intent) CreatedAt() time.Time { return in.current().CreatedAt }

// Request returns a copy of the request the intent sends.
func (in *Intent) Request() Request {
	rec := in.current()
	return Request{Method: rec.Method, URL: rec.URL, Header: rec.Header.Clone(), Body: bytes.Clone(rec.Body)}
}

// Response returns the stored final answer, or nil while the outcome is
// unknown.
func (in *Intent) Response() *Response {
	rec := in.current()
	if rec.Response == nil {
		return nil
	}
	return responseFromStored(rec.Response, 0, true)
}

// matches reports whether req is the request this intent sends.
func (in *Intent) matches(req Request) bool {
	return req.fingerprint() == in.current().Fingerprint
}

// current returns the intent's record. Records held by an Intent are
// immutable: a change makes a new version (a shallow copy; headers and
// bodies are never written in place) and set swaps it in. So the pointer
// may be read without the lock, and must not be written through.
func (in *Intent) current() *persist.Record {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.rec
}

func (in *Intent) set(rec *persist.Record) {
	in.mu.Lock()
	in.rec = rec
	in.mu.Unlock()
}

func (in *Intent) isUnarmed() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.unarmed
}

// replace marks an unarmed intent replaced by one for a changed request.
func (in *Intent) replace() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.replaced = true
}

// UnresolvedError is returned when a new intent is asked for an action
// whose previous intent has an unknown outcome (match it with errors.As).
// Starting a second payment then could pay twice. The app decides: settle
// Previous with Client.Settle (it may still complete, for the old request),
// or, knowingly, drop it with Client.Forget.
type UnresolvedError struct {
	Name     string
	Previous *Intent
}

func (e *UnresolvedError) Error() string {
	return fmt.Sprintf("idem: intent %s for %q has an unknown outcome (%s); before a changed request, settle it (Send with the same request, or Settle), Reconcile it, or Forget it", e.Previous.Key(), e.Name, e.Previous.State())
}

// ResolvedError is returned when an intent is asked for an action whose
// latest intent succeeded, with a request other than that intent's (a
// changed amount, or the same server spelled another way): the action is
// paid, and a new intent could pay it twice. Previous holds the earlier
// intent, and Previous.Response() its stored answer. A deliberate second
// payment for the action is Client.NewIntent.
type ResolvedError struct {
	Name     string
	Previous *Intent
}

func (e *ResolvedError) Error() string {
	return fmt.Sprintf("idem: %q was already paid by intent %s with another request; nothing was sent (use NewIntent for a deliberate second payment)", e.Name, e.Previous.Key())
}
