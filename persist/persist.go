package persist

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// FormatVersion is the version of the Record encoding this release
// writes. Stores write it into every record. They refuse records from a
// newer release rather than misread them.
const FormatVersion = 1

// State is where an intent stands. The zero State is invalid.
type State string

const (
	// StateNew: armed, with no attempt known to have been sent. The
	// client saves it at the user's tap, before the first byte. After a
	// crash, a new intent may still have reached the server. The first
	// attempt is not recorded, to keep one durable write per send.
	// Resuming it is safe because it reuses its key.
	StateNew State = "new"
	// StatePending: at least one attempt may have reached the server.
	// The outcome is unknown.
	StatePending State = "pending"
	// StateSucceeded: the server answered 2xx.
	StateSucceeded State = "succeeded"
	// StateFailed: the server gave a final business answer, such as 402.
	StateFailed State = "failed"
	// StateRejected: the server refused the key (422 reused, 400 key
	// error).
	StateRejected State = "rejected"
	// StateExpired: the outcome is unknown, and the intent is too old to
	// be sent again. Only reconciling can settle it.
	StateExpired State = "expired"
	// StateVoid: reconciling showed that the server has no effect for
	// the key. Nothing happened.
	StateVoid State = "void"
	// StateNotSent: a call of the intent ended without writing its
	// request to any connection. No earlier call can have written it
	// either. So nothing reached the server. The intent is unresolved.
	// But nothing sends it again unless the app asks. A changed request
	// may replace it.
	StateNotSent State = "not_sent"
)

// Resolved reports whether the outcome of an intent in state s is
// known. Resolved intents are never sent again.
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

// Response is the final answer stored with a resolved intent. An app can
// show it after a restart without sending again.
type Response struct {
	StatusCode int         `json:"status_code"`
	Header     http.Header `json:"header,omitempty"`
	// Body is nil when the store was told not to keep response bodies.
	Body []byte `json:"body,omitempty"`
	// Replayed is true when the server answered from its idempotency
	// record (Idempotent-Replayed: true). It did not do the work on this
	// attempt.
	Replayed bool `json:"replayed,omitempty"`
	// Oversized is true when the answer was larger than the client's
	// limit. Its status is known. Its body was not kept. Its header fields
	// were kept only as far as they fitted.
	Oversized bool `json:"oversized,omitempty"`
}

// Record is one intent as stored. Key is its identity in a Store.
type Record struct {
	// Version is the encoding version; stores set it on Write.
	Version int `json:"version"`
	// Rev is this version of the record. Its writer chooses a unique
	// value (NewRev) before each Write. A write whose result is unknown is
	// recognised by it when the record is read back. A conditional Write
	// or Delete names by it the version it replaces.
	Rev string `json:"rev"`
	// Key is the Idempotency-Key, sent unchanged on every attempt.
	Key string `json:"key"`
	// Name groups the intents of one user action ("checkout:cart-42"). An
	// app finds the previous intent for the action by it. It may be
	// empty. A record keeps its Name for life.
	Name string `json:"name,omitempty"`

	Method string      `json:"method"`
	URL    string      `json:"url"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
	// Fingerprint is the hex SHA-256 of the request. It tells a changed
	// body.
	Fingerprint string `json:"fingerprint"`
	// KeyHeader is the Idempotency-Key header's value exactly as every
	// attempt sends it: the key bare, or quoted. It is fixed when the
	// intent is created.
	KeyHeader string `json:"key_header,omitempty"`
	// Seq orders the intents of one Name. A new intent gets one more than
	// the latest intent of its Name. So the order does not depend on the
	// device's clock. A record without one (0) comes before every record
	// of its Name that has one.
	Seq uint64 `json:"seq,omitempty"`

	// CreatedAt is when the intent's age starts. idem's client sets it
	// when the intent is armed at the user's tap. It sets it again when
	// an intent that ended not sent is sent again. Lists are ordered by
	// it.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	State     State     `json:"state"`
	// Attempts counts the attempts put on the wire so far, as last saved.
	Attempts int       `json:"attempts,omitempty"`
	Response *Response `json:"response,omitempty"`
	// Clocks are the device's clock readings stored with the record. The
	// record's age is judged by every clock the device has. It is nil from
	// a client without such clocks.
	Clocks *Clocks `json:"clocks,omitempty"`
	// Tombstone is set on what pruning keeps of an action's latest
	// resolved intent. Its request and response bodies and headers are
	// gone. Its key, name, fingerprint, outcome status and times are kept.
	// So the next tap of the paid action sends nothing.
	Tombstone bool `json:"tombstone,omitempty"`
	// Holder names the client that armed the intent, or last took it over
	// to send it. A client may tell that an armed intent was never sent.
	// It may do so only while the stored record is the version it wrote.
	Holder string `json:"holder,omitempty"`
	// Redirected is set once an attempt of the intent was redirected (307
	// or 308) to another URL. The server fingerprints that as another
	// request. From then on, its "key reused" answer says nothing about
	// the work.
	Redirected bool `json:"redirected,omitempty"`
	// HandedOut is set while the intent's exact request is in the app's
	// hands (idem's Client.HTTPRequest). The app may send it at any time.
	// So no lookup's "not found" is trusted until the app reports that
	// its send ended.
	HandedOut bool `json:"handed_out,omitempty"`
}

// Clocks are a record's clock readings. A reading of the clock that
// counts device sleep compares only with one of the same boot.
type Clocks struct {
	// ArmBoot and Armed: the boot, and the time since it, when the
	// intent was armed. That time includes device sleep.
	ArmBoot string        `json:"arm_boot,omitempty"`
	Armed   time.Duration `json:"armed,omitempty"`
	// WriteBoot and Written: the same at the record's last write.
	WriteBoot string        `json:"write_boot,omitempty"`
	Written   time.Duration `json:"written,omitempty"`
	// ArmMark and Mark: the wall clock's high-water mark when the intent
	// was armed, and at the record's last write. The mark is the latest
	// wall time the client had seen. A clock set back cannot lower it.
	ArmMark time.Time `json:"arm_mark,omitzero"`
	Mark    time.Time `json:"mark,omitzero"`
	// SendWall, SendBoot and SendBy: the latest time the record's holder
	// may begin a send of it, in the call that claimed it. That is the
	// call's budget from the claim. SendWall is on the wall clock.
	// SendBoot and SendBy are on the clock that counts sleep: the boot,
	// and the time since it. The claim writes them: the arming write, a
	// take-over, a send again. A write that sends nothing (an expiry)
	// never does. An attempt may reach the server up to the reconcile
	// delay later.
	SendWall time.Time     `json:"send_wall,omitzero"`
	SendBoot string        `json:"send_boot,omitempty"`
	SendBy   time.Duration `json:"send_by,omitempty"`
}

// Clone returns a deep copy of r. A store's copy and a caller's so never
// share memory.
func (r *Record) Clone() *Record {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = slices.Clone(r.Body)
	if r.Clocks != nil {
		cl := *r.Clocks
		c.Clocks = &cl
	}
	if r.Response != nil {
		resp := *r.Response
		resp.Header = r.Response.Header.Clone()
		resp.Body = slices.Clone(r.Response.Body)
		c.Response = &resp
	}
	return &c
}

// Validate reports what is wrong with r, or nil. Stores call it on Write
// and after decoding. So a record that makes no sense is never sent.
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
	return r.validUTF8()
}

// validUTF8 refuses a Key, a Name or a request header that is not valid
// UTF-8. A file keeps its text in JSON, which would change such bytes.
// The record would then read back unlike the one written.
func (r *Record) validUTF8() error {
	const fix = "not valid UTF-8, which the store cannot keep as is; give UTF-8 (percent-encode other bytes)"
	switch {
	case !utf8.ValidString(r.Key):
		return fmt.Errorf("persist: record key %q is %s", r.Key, fix)
	case !utf8.ValidString(r.Name):
		return fmt.Errorf("persist: record %s has a Name %q that is %s", r.Key, r.Name, fix)
	}
	for k, vs := range r.Header {
		if !utf8.ValidString(k) {
			return fmt.Errorf("persist: record %s has a header field name %q that is %s", r.Key, k, fix)
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return fmt.Errorf("persist: record %s has a value of header %s that is %s", r.Key, k, fix)
			}
		}
	}
	return nil
}

// Filter selects records in List. A record is selected if it meets each
// condition that is set. The zero Filter selects every record.
type Filter struct {
	// Name, if not empty, selects the records with this Name.
	Name string
	// Unresolved selects only records whose State is not Resolved.
	Unresolved bool
}

// match reports whether r is selected by f.
func (f Filter) match(r *Record) bool {
	return (f.Name == "" || r.Name == f.Name) && !(f.Unresolved && r.State.Resolved())
}

// Store keeps records durably.
//
// Implementations must be safe for concurrent use by multiple
// goroutines. Records passed in and handed out are copies, which a caller
// may change freely. Every method honours ctx where it may block.
//
// A record reads back as written, with Version set. A store may return
// times in another location (UTC), without their monotonic reading. It
// may return empty headers and bodies as nil. The stores of this package
// do both. The suite in persisttest checks every store against this
// contract.
//
// Every change is conditional. Write and Delete check the stored record
// and change it in one step. So two writers sharing the store never both
// win. They may be two Clients of one app, or two processes on one
// FileStore directory in turn. No unconditional write exists that a
// wrapper could override alone. A wrapper may embed a Store and change
// records on their way in, to encrypt them, say. It overrides Write, and
// the package's functions all go through it.
//
// A version is a record's Rev, a unique value its writer chooses
// (NewRev) for each write. A Write may return an error, or no answer. Its
// writer then reads the record back to tell whether it landed. The stored
// Rev is its own, or another's (see SameVersion).
type Store interface {
	// Write stores rec, in one step with a check of what is stored.
	//
	//   - old == nil: no record with rec.Key is stored. If rec has a
	//     Name, every stored record of that Name has a Seq lower than
	//     rec.Seq. rec becomes its action's latest intent (see Claim).
	//   - old != nil: the record stored with rec.Key has old's Rev.
	//     old.Key must be rec.Key. rec replaces the record, and must keep
	//     its Name.
	//
	// Otherwise Write stores nothing and returns a *ConflictError. For
	// old == nil, it holds the action's latest record. That is the record
	// with rec.Key if there is one and rec has no Name. For old != nil, it
	// holds the stored record, nil if none is. A record whose Name would
	// change gets another error.
	//
	// rec.Rev must be set, and differ from old's. It is how this write is
	// recognised later. Write rejects a record that fails Validate.
	//
	// When Write returns nil, the record survives a crash of the process.
	// In a durable store, it survives power loss too. When Write returns
	// an error, the caller must not act on the record as written. Either
	// the previous version is intact, or rec is complete but not yet known
	// to be durable. The store's error says when it is the latter: a sync
	// of a durable store failed. A half-written record is never visible. A
	// caller that must know reads the record back and compares its Rev.
	Write(ctx context.Context, rec, old *Record) error
	// Delete removes the record stored with old.Key if it has old's Rev,
	// in one step with that check. Otherwise it deletes nothing and
	// returns a *ConflictError holding the stored record. No record stored
	// with old.Key is not an error. So a delete retried after one that
	// landed succeeds.
	Delete(ctx context.Context, old *Record) error
	// Get returns the record for key, or an error matching ErrNotFound. It
	// returns a *CorruptError if the record cannot be read.
	Get(ctx context.Context, key string) (*Record, error)
	// List returns the records selected by f, oldest CreatedAt first.
	// Some records that f may select may be unreadable. List still
	// returns all readable ones. With them it returns an error that wraps
	// a *CorruptError for each unreadable one. errors.As finds the first,
	// and CorruptErrors returns them all. A store may leave out an
	// unreadable record it can tell f does not select. FileStore tells the
	// Name's hash from the file's name, and a resolved record from its
	// index.
	List(ctx context.Context, f Filter) ([]*Record, error)
}

// ErrNotFound is returned by Get for a key that has no record.
var ErrNotFound = errors.New("persist: intent not found")

// CorruptError reports a stored record that cannot be decoded. Nothing is
// deleted or overwritten because of it. The file stays for inspection,
// and FileStore.Quarantine moves it aside.
type CorruptError struct {
	Path string // the file, if the store keeps files
	// Key is the intent's key, as far as it is known. It is empty when
	// the file name holds only a hash of the key. It is empty too for a
	// stray file, which spells no key: quarantine it, as Delete cannot
	// name it.
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
// errors.Is would visit them. Those are all that List or Prune joined.
// errors.As finds only the first.
func CorruptErrors(err error) []*CorruptError {
	switch e := err.(type) {
	case *CorruptError:
		return []*CorruptError{e}
	case interface{ Unwrap() []error }:
		var out []*CorruptError
		for _, err := range e.Unwrap() {
			out = append(out, CorruptErrors(err)...)
		}
		return out
	case interface{ Unwrap() error }:
		return CorruptErrors(e.Unwrap())
	}
	return nil
}
