package persist

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// FormatVersion is the version of the Record encoding written by this
// release. Stores write it into every record and refuse records from a newer
// release instead of misreading them.
const FormatVersion = 1

// State is where an intent stands. The zero State is invalid.
type State string

const (
	// StateNew: armed (saved at the user's tap, before the first byte), no
	// attempt is known to have been sent. After a crash a new intent may
	// still have reached the server (the first attempt is not recorded, to
	// keep one durable write per send); resuming it is safe because it
	// reuses its key.
	StateNew State = "new"
	// StatePending: at least one attempt may have reached the server and the
	// outcome is unknown.
	StatePending State = "pending"
	// StateSucceeded: the server answered 2xx.
	StateSucceeded State = "succeeded"
	// StateFailed: the server gave a final business answer (for example 402).
	StateFailed State = "failed"
	// StateRejected: the server refused the key (422 reused, 400 key error).
	StateRejected State = "rejected"
	// StateExpired: the outcome is unknown and the intent is too old to be
	// sent again; only reconciling can settle it.
	StateExpired State = "expired"
	// StateVoid: reconciling showed that the server has no effect for the
	// key: nothing happened.
	StateVoid State = "void"
	// StateNotSent: a call of the intent ended without writing its
	// request to any connection, and no earlier call can have: nothing
	// reached the server. It is unresolved, but nothing sends it again
	// unless the app asks, and a changed request may replace it.
	StateNotSent State = "not_sent"
)

// Resolved reports whether the outcome of an intent in state s is known.
// Resolved intents are never sent again.
func (s State) Resolved() bool {
	switch s {
	case StateSucceeded, StateFailed, StateRejected, StateVoid:
		return true
	}
	return false
}

// valid reports whether s is one of the defined states.
func (s State) valid() bool {
	switch s {
	case StateNew, StatePending, StateSucceeded, StateFailed, StateRejected, StateExpired, StateVoid, StateNotSent:
		return true
	}
	return false
}

// Response is the final answer stored with a resolved intent, so that an app
// can show it after a restart without sending again.
type Response struct {
	StatusCode int         `json:"status_code"`
	Header     http.Header `json:"header,omitempty"`
	// Body is nil when the store was told not to keep response bodies.
	Body []byte `json:"body,omitempty"`
	// Replayed is true when the server answered from its idempotency record
	// (Idempotent-Replayed: true) rather than doing the work on this attempt.
	Replayed bool `json:"replayed,omitempty"`
	// Oversized is true when the answer was larger than the client's limit:
	// its status is known, its body was not kept and its header fields only
	// so far as they fitted.
	Oversized bool `json:"oversized,omitempty"`
}

// Record is one intent as stored. Key is its identity in a Store.
type Record struct {
	// Version is the encoding version; stores set it on Write.
	Version int `json:"version"`
	// Rev is this version of the record: a unique value its writer
	// chooses (NewRev) before each Write, so that a write whose result is
	// unknown is recognised when the record is read back, and so that a
	// conditional Write or Delete names the version it replaces.
	Rev string `json:"rev"`
	// Key is the Idempotency-Key, sent unchanged on every attempt.
	Key string `json:"key"`
	// Name groups the intents of one user action ("checkout:cart-42"), so an
	// app can find the previous intent for it. It may be empty.
	Name string `json:"name,omitempty"`

	Method string      `json:"method"`
	URL    string      `json:"url"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
	// Fingerprint is the hex SHA-256 of the request, to tell a changed body.
	Fingerprint string `json:"fingerprint"`
	// KeyHeader is the Idempotency-Key header's value exactly as every
	// attempt sends it (the key bare, or quoted), fixed when the intent is
	// created.
	KeyHeader string `json:"key_header,omitempty"`
	// Seq orders the intents of one Name: a new intent gets one more than
	// the latest intent for its name, so that the order does not depend on
	// the device's clock. A record without one (0) comes before every
	// record of its Name that has one.
	Seq uint64 `json:"seq,omitempty"`

	// CreatedAt is when the intent's age starts: idem's client sets it
	// when the intent is armed at the user's tap, and again when an
	// intent that ended not sent is sent again. Lists are ordered by it.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	State     State     `json:"state"`
	// Attempts counts the attempts put on the wire so far, as last saved.
	Attempts int       `json:"attempts,omitempty"`
	Response *Response `json:"response,omitempty"`
	// Clocks are the device's clock readings stored with the record, so
	// that its age is judged by every clock the device has. Nil from a
	// client without such clocks.
	Clocks *Clocks `json:"clocks,omitempty"`
	// Tombstone is set on what pruning keeps of an action's latest
	// resolved intent: its request and response bodies and headers are
	// gone, its key, name, fingerprint, outcome status and times are kept,
	// so that the next tap of the paid action sends nothing.
	Tombstone bool `json:"tombstone,omitempty"`
	// Holder names the client that armed the intent or last took it over
	// to send it: a client may tell that an armed intent was never sent
	// only while the stored record is the version it wrote.
	Holder string `json:"holder,omitempty"`
	// Redirected is set once an attempt of the intent was redirected (307
	// or 308) to another URL, whose request the server fingerprints as
	// another request: from then on its "key reused" answer says nothing
	// about the work.
	Redirected bool `json:"redirected,omitempty"`
	// HandedOut is set while the intent's exact request is in the app's
	// hands (idem's Client.HTTPRequest), which may send it at any time:
	// no lookup's "not found" is trusted until the app reports that its
	// send ended.
	HandedOut bool `json:"handed_out,omitempty"`
}

// Clocks are a record's clock readings. A reading of the clock that counts
// device sleep is comparable only with one of the same boot.
type Clocks struct {
	// ArmBoot and Armed: the boot, and the time since it (device sleep
	// included), when the intent was armed.
	ArmBoot string        `json:"arm_boot,omitempty"`
	Armed   time.Duration `json:"armed,omitempty"`
	// WriteBoot and Written: the same at the record's last write.
	WriteBoot string        `json:"write_boot,omitempty"`
	Written   time.Duration `json:"written,omitempty"`
	// ArmMark and Mark: the wall clock's high-water mark (the latest wall
	// time the client had seen) when the intent was armed, and at the
	// record's last write. A clock set back cannot lower them.
	ArmMark time.Time `json:"arm_mark,omitzero"`
	Mark    time.Time `json:"mark,omitzero"`
	// SendWall, SendBoot and SendBy: the latest time the record's holder
	// may begin a send of it in the call that claimed it (that call's
	// budget from the claim), on the wall
	// clock and on the clock that counts sleep (the boot and the time
	// since it). Written by the claim (the arming write, a take-over, a
	// send again), never by a write that sends nothing (an expiry): an
	// attempt of it may reach the server up to the reconcile delay later.
	SendWall time.Time     `json:"send_wall,omitzero"`
	SendBoot string        `json:"send_boot,omitempty"`
	SendBy   time.Duration `json:"send_by,omitempty"`
}

// Clone returns a deep copy of r, so a store's copy and a caller's never
// share memory.
func (r *Record) Clone() *Record {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = cloneBytes(r.Body)
	if r.Clocks != nil {
		cl := *r.Clocks
		c.Clocks = &cl
	}
	if r.Response != nil {
		resp := *r.Response
		resp.Header = r.Response.Header.Clone()
		resp.Body = cloneBytes(r.Response.Body)
		c.Response = &resp
	}
	return &c
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// Validate reports what is wrong with r, or nil. Stores call it on Write and
// after decoding, so a record that makes no sense is never sent.
func (r *Record) Validate() error {
	switch {
	case r.Key == "":
		return errors.New("persist: record has no key")
	case r.Method == "":
		return fmt.Errorf("persist: record %s has no method", r.Key)
	case r.URL == "":
		return fmt.Errorf("persist: record %s has no URL", r.Key)
	case !r.State.valid():
		return fmt.Errorf("persist: record %s has unknown state %q", r.Key, r.State)
	case r.CreatedAt.IsZero():
		return fmt.Errorf("persist: record %s has no creation time", r.Key)
	case strings.IndexFunc(r.KeyHeader, func(c rune) bool { return c < 0x20 || c > 0x7e }) >= 0:
		return fmt.Errorf("persist: record %s has a key header value that is not printable ASCII", r.Key)
	case len(r.Rev) > maxRev || strings.IndexFunc(r.Rev, func(c rune) bool { return c <= 0x20 || c > 0x7e }) >= 0:
		return fmt.Errorf("persist: record %s has a version (Rev) that is not up to %d printable ASCII characters without spaces", r.Key, maxRev)
	}
	return nil
}

// Filter selects records in List: a record is selected if it meets each
// condition that is set. The zero Filter selects every record.
type Filter struct {
	// Name, if not empty, selects the records with this Name.
	Name string
	// Unresolved selects only records whose State is not Resolved.
	Unresolved bool
}

// match reports whether r is selected by f.
func (f Filter) match(r *Record) bool {
	if f.Name != "" && r.Name != f.Name {
		return false
	}
	if f.Unresolved && r.State.Resolved() {
		return false
	}
	return true
}

// Store keeps records durably.
//
// Implementations must be safe for concurrent use by multiple goroutines.
// Records passed in and handed out are copies: a caller may change them
// freely. Every method honours ctx where it may block.
//
// A record reads back as written, with Version set, except that a store may
// return times in another location (UTC) without their monotonic reading,
// and empty headers and bodies as nil. The stores of this package do both;
// the suite in persisttest checks every store against this contract.
//
// Every change is conditional. Write and Delete check the stored record
// and change it in one step, so that two writers sharing the store (two
// Clients of one app, or two processes on one FileStore directory in
// turn) never both win. There is no unconditional write a wrapper could
// override alone: a wrapper that embeds a Store and changes records on
// their way in (one that encrypts them, say) overrides Write, and the
// package's functions all go through it.
//
// A version is a record's Rev: a unique value its writer chooses (NewRev)
// for each write. A writer whose Write returned an error, or no answer,
// tells whether it landed by reading the record back: the stored Rev is
// its own, or another's (see SameVersion).
type Store interface {
	// Write stores rec, in one step with a check of what is stored:
	//
	//   - old == nil: no record with rec.Key is stored, and, if rec has a
	//     Name, every stored record of that Name has a Seq lower than
	//     rec.Seq. rec becomes its action's latest intent (see Claim).
	//   - old != nil: the record stored with rec.Key (old.Key must be
	//     rec.Key) has old's Rev. rec replaces it, and must keep its Name.
	//
	// Otherwise Write stores nothing and returns a *ConflictError: for
	// old == nil it holds the action's latest record (the record with
	// rec.Key if there is one and rec has no Name), for old != nil the
	// stored record, nil if none is. A record whose Name would change
	// gets another error.
	//
	// rec.Rev must be set, and differ from old's: it is how this write is
	// recognised later. Write rejects a record that fails Validate.
	//
	// When Write returns nil the record survives a crash of the process
	// and, for durable stores, power loss. When it returns an error the
	// caller must not act on the record as written: either the previous
	// version is intact or, if the store says so in the error (a sync of
	// a durable store failed), rec is complete but not yet known to be
	// durable. A half-written record is never visible. A caller that must
	// know reads the record back and compares its Rev.
	Write(ctx context.Context, rec, old *Record) error
	// Delete removes the record stored with old.Key if it has old's Rev,
	// in one step with that check; otherwise it deletes nothing and
	// returns a *ConflictError holding the stored record. No record
	// stored with old.Key is not an error: a delete retried after one
	// that landed succeeds.
	Delete(ctx context.Context, old *Record) error
	// Get returns the record for key, or an error matching ErrNotFound, or a
	// *CorruptError if it cannot be read.
	Get(ctx context.Context, key string) (*Record, error)
	// List returns the records selected by f, oldest CreatedAt first. If
	// some records that f may select cannot be read, List still returns
	// all readable ones, together with an error that wraps a *CorruptError
	// for each unreadable one: errors.As finds the first, CorruptErrors
	// returns them all. A store may leave out an unreadable record it can
	// tell f does not select (FileStore can tell a record's resolution and
	// a hash of its Name from the file's name).
	List(ctx context.Context, f Filter) ([]*Record, error)
}

// ErrNotFound is returned by Get for a key that has no record.
var ErrNotFound = errors.New("persist: intent not found")

// CorruptError reports a stored record that cannot be decoded. Nothing is
// deleted or overwritten because of it: the file stays for inspection, and
// FileStore.Quarantine moves it aside.
type CorruptError struct {
	Path string // the file, if the store keeps files
	// Key is the intent's key, as far as it is known: empty when the file
	// name holds only a hash of the key, or spells no key at all (a stray
	// file: quarantine it, Delete cannot name it).
	Key string
	Err error
}

func (e *CorruptError) Error() string {
	if errors.Is(e.Err, ErrNewerVersion) {
		// Removing it would lose an intent a newer release still tracks.
		return fmt.Sprintf("persist: intent %q in %s is from a newer release (left in place; upgrade the app to read it): %v", e.Key, e.Path, e.Err)
	}
	return fmt.Sprintf("persist: intent %q in %s is unreadable (left in place; inspect it, then quarantine or remove it): %v", e.Key, e.Path, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// CorruptErrors returns every *CorruptError in err's tree, in the order
// errors.Is would visit them: all those List or Prune joined, where
// errors.As finds only the first.
func CorruptErrors(err error) []*CorruptError {
	var out []*CorruptError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *CorruptError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, err := range e.Unwrap() {
				walk(err)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}
