package idem

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/persist"
)

// Intent is one thing the user means to do, such as paying for this cart.
// It holds one Idempotency-Key for its whole life. It holds the exact
// request to send with that key. Client.Send makes and sends one in one
// call. Client.Intent, Client.NewIntent, Client.Load and Client.Unresolved
// hand one out. Client.Settle and Client.Do send it.
//
// An Intent is safe for concurrent use. Its accessors report the state as
// of the last change made through this process.
type Intent struct {
	mu  sync.Mutex
	rec *persist.Record // guarded by mu; never shared with a store
	// ephemeral intents live only in memory and are never saved. The
	// RoundTripper's keys made for one request are such.
	ephemeral bool
	// callersKey marks an ephemeral intent under a key the caller chose.
	// The caller may have sent it before, in its own retry. So it is never
	// provably unsent.
	callersKey bool
	// unsent is what the Client that handed the intent out knows of its
	// keys. It says which intents are provably unsent.
	unsent unsentKeys

	// unarmed is set while the intent lives in this process's memory
	// only. Intent or NewIntent made it, and Do has not had it yet (the
	// tap). mu guards it, and armMu serialises the arming.
	unarmed bool
	armMu   sync.Mutex
	// armRoom is memory for the armed version, made with the Intent. Only
	// its arming uses it, under armMu.
	armRoom *armedVersion
	// force is set for an intent of NewIntent. Arming it never adopts
	// another intent of the action with the same request.
	force bool
	// after is the version of the action's latest stored intent when
	// this unarmed intent was made, or "" if none. Intent hands it out
	// again only while that is still the latest.
	after string
	// overVoid is the key of that latest intent if it was void, else "".
	// A void may later be written over by the server's word that the
	// work was done. Arming reads it again (see Client.arm).
	overVoid string
	// replaced is set when Intent replaced this unarmed intent with one
	// for a changed request. A replaced intent is never sent.
	replaced bool
}

// Key returns the Idempotency-Key, the same on every attempt.
func (in *Intent) Key() string { return in.current().Key }

// Name returns the action the intent belongs to, as given to Client.Intent.
func (in *Intent) Name() string { return in.current().Name }

// unsentKeys tells the keys that are provably unsent (keys.isUnsent). Nil
// knows none.
type unsentKeys interface{ isUnsent(key string) bool }

// State returns where the intent stands. An intent stored as new reads
// new only while this process knows it was never sent. That is while the
// Client that created it has not sent it, or Intent replaced it unsent.
// Otherwise it reads pending, after a restart for instance. The first
// attempt is not recorded, so it may have reached the server before a
// crash.
func (in *Intent) State() persist.State {
	in.mu.Lock()
	rec, unarmed := in.rec, in.unarmed
	in.mu.Unlock()
	if unarmed {
		return persist.StateNew
	}
	if rec == nil {
		return "" // a zero Intent, made by no Client
	}
	if rec.State == persist.StateNew && (in.unsent == nil || !in.unsent.isUnsent(rec.Key)) {
		return persist.StatePending
	}
	return rec.State
}

// Attempts returns how many attempts have been put on the wire for the
// intent, over all calls and restarts. It may miss the first attempt of a
// call that got no answer before a crash.
func (in *Intent) Attempts() int { return in.current().Attempts }

// UpdatedAt returns when the intent was last created, attempted or
// resolved. An app shows "pending for 3 minutes" from it.
func (in *Intent) UpdatedAt() time.Time { return in.current().UpdatedAt }

// CreatedAt returns when the intent's age starts. Its age decides when it
// may no longer be sent. The age starts at the tap that armed it, its
// first Do or Send. The server's retention of its key starts no sooner
// than its first attempt. Before the tap, CreatedAt is when Intent or
// NewIntent made it. An intent that ended not sent may be sent again. It
// then ages from that send, since none began before.
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
// immutable. A change makes a new version, and set swaps it in. The new
// version is a shallow copy, since headers and bodies are never written
// in place. So the pointer may be read without the lock. It must not be
// written through.
func (in *Intent) current() *persist.Record {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.rec == nil {
		return &noRecord
	}
	return in.rec
}

// noRecord is what a zero Intent's accessors read. They give zero
// values, and the calls refuse such an Intent.
var noRecord persist.Record

// made reports an Intent that idem made or loaded. A nil or zero one is
// refused.
func (in *Intent) made() bool {
	if in == nil {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.rec != nil
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
// whose previous intent has an unknown outcome. Match it with errors.As.
// Starting a second payment then could pay twice. So the app decides. It
// may settle Previous with Client.Settle, which may still complete it for
// the old request. Or it may knowingly drop it with Client.Forget.
type UnresolvedError struct {
	Name     string
	Previous *Intent
}

func (e *UnresolvedError) Error() string {
	return fmt.Sprintf("idem: intent %s for %q has an unknown outcome (%s); before a changed request, settle it (Send with the same request, or Settle), Reconcile it, or Forget it", e.Previous.Key(), e.Name, e.Previous.State())
}

// ResolvedError is returned when an intent is asked for an action whose
// latest intent succeeded, with another request. The amount may have
// changed, or the same server may be spelled another way. The action is
// paid, and a new intent could pay it twice. Previous holds the earlier
// intent, and Previous.Response() its stored answer. Client.NewIntent
// makes a deliberate second payment for the action.
type ResolvedError struct {
	Name     string
	Previous *Intent
}

func (e *ResolvedError) Error() string {
	return fmt.Sprintf("idem: %q was already paid by intent %s with another request; nothing was sent (use NewIntent for a deliberate second payment)", e.Name, e.Previous.Key())
}

// armedVersion is an intent's armed version, with room for its clock
// readings.
type armedVersion struct {
	rec    persist.Record
	clocks persist.Clocks
}
