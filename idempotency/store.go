package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"time"
)

// ErrNotOwner is returned by [Store.Complete] and [Store.Release] when the
// caller no longer holds the record. Its lease was taken over, or the
// record expired and was replaced or swept.
var ErrNotOwner = errors.New("idempotency: record is no longer held by this worker")

// ErrStoreFull is matched by the error of [Store.Insert] when the store
// holds as many records as it may. Nothing was stored. The middleware
// answers 503, type storage-full. To a client every 5xx is an unknown
// outcome. So it retries, and finds the key unused.
var ErrStoreFull = errors.New("idempotency: store is full")

// ErrUnavailable is matched by a store's error when its database cannot
// decide now. It may be a standby in recovery, or refuse writes. A
// failover or a pooler can send the query to a standby. A read there
// could miss a record the primary holds. So the store refuses rather
// than answer "nothing was done".
//
// Nothing was decided or done under the key. The middleware answers 503
// with Retry-After. The client retries with the same key, and a primary
// answers it.
//
// pgstore also returns it when PostgreSQL rolled a transaction back on a
// serialization failure or a deadlock. Nothing was committed then.
var ErrUnavailable = errors.New("idempotency: the store's database cannot decide now")

// fullError is an [ErrStoreFull] that says when room is expected. That is
// when the oldest record expires. The middleware sends the time left as
// Retry-After.
type fullError struct {
	Until time.Time
	// Now is the store's now, on the clock of Until (zero: the caller's).
	Now time.Time
}

func (e *fullError) Error() string {
	return "idempotency: store is full until " + e.Until.UTC().Format(time.RFC3339)
}

// Is makes a fullError match [ErrStoreFull].
func (e *fullError) Is(target error) bool { return target == ErrStoreFull }

// The states of a [Record] (its Status).
const (
	// StatusInProgress: a worker holds the record and is doing the work.
	StatusInProgress = "IN_PROGRESS"
	// StatusCompleted: the work is done and the response is stored.
	StatusCompleted = "COMPLETED"
)

// ID is a record's primary key. It is the key, scoped to the caller that
// sent it. Two callers that pick the same key have different IDs.
type ID struct {
	// Principal is the account the request acts for ([Config.Principal]).
	// A store keeps its [PrincipalDigest], never the principal itself.
	Principal string
	Key       string
}

// principalDomain separates the principal's digest from every other
// SHA-256 of the same bytes. Changing it orphans every stored record.
const principalDomain = "idem.principal.v1:"

// PrincipalDigest is what a store keeps in place of a principal. It is
// the SHA-256 of "idem.principal.v1:" followed by the principal. It is
// in lower-case hex, 64 characters whatever the principal's length.
//
// A principal is meant to be an account name. But a server may return a
// credential, such as a bearer token. Records live for the whole
// retention. The digest keeps a credential out of the store, its backups
// and its logs. It also keeps a long principal within an index's limits.
// In SQL (PostgreSQL 11 or later):
//
//	encode(sha256(convert_to('idem.principal.v1:' || principal, 'UTF8')), 'hex')
//
// It is not keyed. So every process finds a record without sharing a
// secret. And no key's rotation can orphan live records. The digest of a
// high-entropy token, like a bearer token or an API key, cannot be
// reversed. A low-entropy secret, like a password, could be guessed from
// it. That is one more reason for Principal to return the account, never
// a credential.
func PrincipalDigest(principal string) string {
	// The memory store digests the principal at every call. So an
	// account name's digest is made on the stack.
	in := make([]byte, 0, 128)
	in = append(append(in, principalDomain...), principal...)
	sum := sha256.Sum256(in)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// Record is one row of the idempotency table.
type Record struct {
	ID ID
	// Fingerprint identifies the request's content. It is SHA-256 over its
	// method, path, query and body. docs/SERVER.md, "The fingerprint",
	// gives the rules.
	Fingerprint [sha256.Size]byte
	// FingerprintVersion is the algorithm Fingerprint was made with. This
	// release makes only version 1. A record of any other version, 0
	// included, never matches a request. Stores keep it as they were given
	// it. So a release that changes the algorithm can tell its records from
	// this one's.
	FingerprintVersion int
	// Status is StatusInProgress or StatusCompleted.
	Status string
	// StableID is the server's own id for the intent. It is created with
	// the record and kept across takeovers. The server gives it to an
	// external provider as that provider's idempotency key.
	StableID string
	// Owner is the lease token of the worker holding an IN_PROGRESS record.
	Owner string
	// LockedUntil is the end of the owner's lease. After it, another
	// request may take the record over.
	LockedUntil time.Time
	// CreatedAt is when the key was first used. Retention counts from here.
	CreatedAt time.Time
	// ExpiresAt is CreatedAt plus the retention period. From then on the
	// record counts as absent. A record IN_PROGRESS under a live lease is
	// the exception ([Record.Expired]).
	ExpiresAt time.Time
	// Response is the stored answer of a COMPLETED record.
	Response *Response
	// ReadAt is the store's now when it read the record for its caller.
	// Insert's existing record has it, and so do TxStore's Get and RunOnce.
	// LockedUntil is judged against it, never against the caller's clock.
	// A host whose clock is ahead would take a live lease for ended. One
	// behind would keep a dead worker's key for the length of its skew.
	// Zero means the store judges on its callers' clock, as a MemoryStore
	// without Clock does.
	ReadAt time.Time
}

// Expired reports whether r counts as absent at now. That is when its
// retention has ended and it is not IN_PROGRESS under a live lease.
//
// A record never expires under its live worker. The worker may have
// taken it over just before its retention ended. Its lease may outlast
// the retention. Still a resend must not find the key new while the
// worker runs. It would run the request again under a new stable id.
func (r *Record) Expired(now time.Time) bool { return !r.liveUntil().After(now) }

// liveUntil is when r expires. It is ExpiresAt, or the end of its lease
// if r is IN_PROGRESS and the lease ends later.
func (r *Record) liveUntil() time.Time {
	if r.Status == StatusInProgress && r.LockedUntil.After(r.ExpiresAt) {
		return r.LockedUntil
	}
	return r.ExpiresAt
}

// Response is a stored answer: what a replay needs and nothing more.
// Stores and their callers treat a stored Response as immutable.
type Response struct {
	StatusCode int
	// Header holds only the fields a replay needs (Content-Type, Location).
	Header http.Header
	Body   []byte
}

// Store holds idempotency records. Every method is one atomic step. A
// PostgreSQL Store runs each as one statement or one transaction. Stores
// are safe for concurrent use by multiple goroutines. The middleware
// relies on that, and on nothing else, to decide races between requests.
//
// A store judges leases and retention on its own clock. Every process
// that shares the store reads that one clock. A SQL store's is the
// database's. So hosts whose clocks disagree cannot both hold one
// record. A host 30 seconds ahead does not see a live lease as ended.
//
// The times its callers give (rec.CreatedAt, now) are their clocks'
// readings. They say durations only. Say a record is inserted with
// CreatedAt c and ExpiresAt c+24h. It lives 24 hours from when the store
// inserts it, by the store's clock. A store for tests takes an injected
// clock, such as a clock.Manual, as its own.
//
// A store bounds every wait for its database. A wait past its bound is
// an error matching context.DeadlineExceeded. The middleware answers it
// with 503 and Retry-After.
type Store interface {
	// Insert stores rec as a new record unless a live record with rec.ID
	// exists. It is one atomic step, as INSERT ... ON CONFLICT is with a
	// primary key. A record expired at the store's now counts as absent
	// and is replaced ([Record.Expired]).
	//
	// The record is created at the store's now, which is its CreatedAt.
	// Its LockedUntil and ExpiresAt are as far from it as rec's are from
	// rec.CreatedAt.
	//
	// Insert returns (nil, true, nil) when rec was inserted. It returns
	// (existing, false, nil) when it was not. existing is a copy that the
	// caller may keep. Its times are the store's, and its ReadAt is the
	// store's now.
	//
	// A store may bound its records. Then it returns an error matching
	// [ErrStoreFull] for a new record it has no room for. A live record
	// with rec.ID is still returned as existing.
	Insert(ctx context.Context, rec *Record) (existing *Record, inserted bool, err error)

	// TakeOver hands the IN_PROGRESS record id to a new worker. It is a
	// compare-and-swap on the lease. Its Owner must still be from, and its
	// lease must have ended at the store's now. Then TakeOver sets Owner to
	// to, and reports true. The new lease lasts until-now from the store's
	// now. Of many requests racing for one dead worker's record, exactly
	// one wins.
	//
	// An empty to is the owner from giving the record up. Its lease ends at
	// once, however much of it was left. The record stays IN_PROGRESS for
	// the next request to take over.
	TakeOver(ctx context.Context, id ID, from, to string, now, until time.Time) (bool, error)

	// Complete ends owner's work on id in one atomic step. It runs commit,
	// the request's effect (nil for none). If commit succeeds, it marks the
	// record COMPLETED with resp. If commit fails, nothing changes and its
	// error is returned. If owner does not hold an IN_PROGRESS record id,
	// commit is not run and the error is [ErrNotOwner].
	//
	// commit runs inside the store's atomic step. That is under its lock,
	// or inside its transaction, which a SQL store passes in ctx. commit
	// must not call the Store.
	Complete(ctx context.Context, id ID, owner string, resp *Response, commit func(context.Context) error) error

	// Release deletes the IN_PROGRESS record id if owner holds it. The key
	// is then free again. It returns [ErrNotOwner] otherwise.
	Release(ctx context.Context, id ID, owner string) error

	// Sweep deletes every record expired at the store's now, and returns
	// how many. now is the caller's. A record IN_PROGRESS under a live
	// lease is never expired ([Record.Expired]).
	Sweep(ctx context.Context, now time.Time) (int, error)
}

// TxStore is a [Store] that can run a fresh key's whole request in one
// transaction of its own ([Config.OneTransaction]). It serves handlers
// whose effect lives in the same database. The record, the effect and
// the answer commit once. A crash before the commit leaves nothing. So
// no IN_PROGRESS record is committed, and no lease is needed. Requests
// for one key are kept apart by a lock on the key. The lock is taken
// without waiting, and ends with the transaction.
type TxStore interface {
	Store

	// Get returns the live record id at the store's now, if there is one.
	// now is the caller's, for stores that judge on it. A key whose request
	// runs in RunOnce elsewhere reads as an IN_PROGRESS record. It has no
	// owner, and its lease ends at the store's now. So a lookup answers
	// "in progress" rather than "nothing was done".
	Get(ctx context.Context, id ID, now time.Time) (rec *Record, found bool, err error)

	// RunOnce runs do for rec.ID inside one transaction, holding the key's
	// lock alone. In that transaction it commits the record COMPLETED with
	// the answer do returns. ctx, as do gets it, carries the transaction.
	// do writes its effect through it. A SQL store's documentation says
	// how.
	//
	// When the key has a live record, do is not run, and existing is
	// returned. The same holds when the key's lock is held. Then existing
	// is rec, IN_PROGRESS, with no owner and rec's lease.
	//
	// The key's record may be a lease-mode one, IN_PROGRESS, whose lease
	// has ended. If its fingerprint and version are rec's, RunOnce takes it
	// over in the transaction. It passes the record to do as abandoned,
	// which is nil for a fresh key. The COMPLETED record keeps its stable
	// id. The take-over commits with the work, or not at all.
	//
	// When do returns an error, or a nil answer, the transaction rolls
	// back. A nil answer is a server error. Nothing is stored. A live
	// record may appear before the commit, from a lease-mode worker. It
	// rolls do's effect back and is returned as existing.
	//
	// A store bounds its wait for a connection and the first answer. It
	// reports a longer wait as an error matching context.DeadlineExceeded,
	// and nothing is done. A commit with no answer in its bound is
	// reported the same way, and may have committed.
	RunOnce(ctx context.Context, rec *Record, do func(ctx context.Context, abandoned *Record) (*Response, error)) (existing *Record, err error)
}
