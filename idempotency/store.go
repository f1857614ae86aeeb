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
// caller no longer holds the record: its lease was taken over, or the record
// expired and was replaced or swept.
var ErrNotOwner = errors.New("idempotency: record is no longer held by this worker")

// ErrStoreFull is matched by the error of [Store.Insert] when the store
// refuses a new record because it holds as many as it may. Nothing was
// stored. The middleware answers 503, type storage-full: a client
// retries it (every 5xx is an unknown outcome to a client) and finds the
// key unused.
var ErrStoreFull = errors.New("idempotency: store is full")

// ErrUnavailable is matched by a store's error when its database cannot
// decide now: it is a standby in recovery (after a failover, or a pooler
// that sent the query to a replica), or it refuses writes. A read there
// could miss a record the primary holds, so the store refuses instead of
// answering "nothing was done". Nothing was decided or done under the
// key. The middleware answers 503 with Retry-After: the client retries
// with the same key, and a primary answers it. pgstore also returns it
// for a transaction that PostgreSQL rolled back on a serialization
// failure or a deadlock: nothing was committed.
var ErrUnavailable = errors.New("idempotency: the store's database cannot decide now")

// fullError is an [ErrStoreFull] that says when room is expected: when the
// oldest record expires. The middleware sends the time left as Retry-After.
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

// ID is a record's primary key: the key, scoped to the caller that sent it.
// Two callers that pick the same key have different IDs.
type ID struct {
	// Principal is the account the request acts for ([Config.Principal]).
	// A store keeps its [PrincipalDigest], never the principal itself.
	Principal string
	Key       string
}

// principalDomain separates the principal's digest from every other
// SHA-256 of the same bytes. Changing it orphans every stored record.
const principalDomain = "idem.principal.v1:"

// PrincipalDigest is what a store keeps in place of a principal: the
// SHA-256 of "idem.principal.v1:" followed by the principal, in lower-case
// hex (64 characters, whatever the principal's length). A principal is
// meant to be an account name, but a server may return a credential (a
// bearer token), and records live for the whole retention: the digest
// keeps it out of the store, its backups and its logs, and keeps a long
// one within an index's limits. In SQL (PostgreSQL 11 or later):
//
//	encode(sha256(convert_to('idem.principal.v1:' || principal, 'UTF8')), 'hex')
//
// It is not keyed, so every process finds a record without sharing a
// secret and there is no key whose rotation could orphan live records.
// An unkeyed digest of a high-entropy token (any bearer token or API key)
// cannot be reversed; a low-entropy secret (a password) could be guessed
// from it, which is one more reason for Principal to return the account,
// never a credential.
func PrincipalDigest(principal string) string {
	// On the stack for a principal of an account name's length: the
	// memory store digests the principal at every call.
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
	// Fingerprint identifies the request's content: SHA-256 over its
	// method, path, query and body (see "Fingerprint" in the package docs).
	Fingerprint [sha256.Size]byte
	// FingerprintVersion is the algorithm Fingerprint was made with: 1
	// (method, path, query and body), the only one this release makes. A
	// record of any other version, 0 included, never matches a request.
	// Stores keep it as they were given it, so that a release that changes
	// the algorithm can tell its records from this one's.
	FingerprintVersion int
	// Status is StatusInProgress or StatusCompleted.
	Status string
	// StableID is the server's own id for the intent, created with the
	// record and kept across takeovers. It is the idempotency key the
	// server gives an external provider (see "External side effects" in the
	// package docs).
	StableID string
	// Owner is the lease token of the worker holding an IN_PROGRESS record.
	Owner string
	// LockedUntil is the end of the owner's lease. After it, another request
	// may take the record over.
	LockedUntil time.Time
	// CreatedAt is when the key was first used; retention counts from here.
	CreatedAt time.Time
	// ExpiresAt is CreatedAt plus the retention period. From ExpiresAt on the
	// record counts as absent, unless it is IN_PROGRESS under a live lease
	// (see [Record.Expired]).
	ExpiresAt time.Time
	// Response is the stored answer of a COMPLETED record.
	Response *Response
	// ReadAt is the store's now when it read the record for its caller
	// (Insert's existing, TxStore's Get and RunOnce). LockedUntil is judged
	// against it, never against the caller's clock: a host whose clock is
	// ahead would take a live lease for ended, and one behind would keep a
	// dead worker's key for the length of its skew. Zero means the store
	// judges on its callers' clock (a MemoryStore without Clock).
	ReadAt time.Time
}

// Expired reports whether r counts as absent at now: its retention has
// ended and it is not IN_PROGRESS under a live lease. A record is never
// expired under its live worker, even one that took it over just before
// its retention ended with a lease that outlasts it: a resend must not find
// the key new and run the request again under a new stable id while the
// worker still runs.
func (r *Record) Expired(now time.Time) bool { return !r.liveUntil().After(now) }

// liveUntil is when r expires: ExpiresAt, or the end of its lease if it is
// IN_PROGRESS and the lease ends later.
func (r *Record) liveUntil() time.Time {
	if r.Status == StatusInProgress && r.LockedUntil.After(r.ExpiresAt) {
		return r.LockedUntil
	}
	return r.ExpiresAt
}

// Response is a stored answer: what a replay needs and nothing more. Stores
// and their callers treat a Response as immutable once stored.
type Response struct {
	StatusCode int
	// Header holds only the fields a replay needs (Content-Type, Location).
	Header http.Header
	Body   []byte
}

// Store holds idempotency records. Every method is one atomic step: a
// PostgreSQL Store runs each as one statement or one transaction. Stores are
// safe for concurrent use by multiple goroutines; the middleware relies on
// that, and on nothing else, to decide races between requests.
//
// A store judges leases and retention on its own clock, one for every
// process that shares it (a SQL store's is the database's), so that hosts
// whose clocks disagree cannot both hold one record: a host 30 seconds
// ahead does not see a live lease as ended. The times its callers give
// (rec.CreatedAt, now) are their clocks' readings, and say durations: a
// record inserted with CreatedAt c and ExpiresAt c+24h lives 24 hours from
// the moment the store inserts it, by the store's clock. A store for tests
// takes an injected clock (a clock.Manual) as its own.
//
// A store bounds every wait for its database, and reports a wait past its
// bound as an error matching context.DeadlineExceeded, which the
// middleware answers with 503 and Retry-After.
type Store interface {
	// Insert stores rec as a new record unless a live record with rec.ID
	// exists, in one atomic step, as INSERT ... ON CONFLICT does with a
	// primary key. The record is created at the store's now: its
	// CreatedAt is that, and its LockedUntil and ExpiresAt are as far from
	// it as rec's are from rec.CreatedAt. A record that is expired at the
	// store's now (see [Record.Expired]) counts as absent and is replaced. It returns (nil, true,
	// nil) when rec was inserted and (existing, false, nil) when it was not;
	// existing is a copy that the caller may keep, its times the store's,
	// its ReadAt the store's now. A
	// store with a bound on its records returns an error matching
	// [ErrStoreFull] for a new record it has no room for (a live record with
	// rec.ID is still returned as existing).
	Insert(ctx context.Context, rec *Record) (existing *Record, inserted bool, err error)

	// TakeOver hands the IN_PROGRESS record id to a new worker, as a
	// compare-and-swap on the lease: only if its Owner is still from and its
	// lease has ended at the store's now, it sets Owner to to and the lease
	// to last until-now from the store's now, and reports true. Of many
	// requests racing for one dead worker's record, exactly one wins. An
	// empty to is the owner from giving the record up: its lease ends at
	// once, however much of it was left, and the record stays IN_PROGRESS
	// for the next request to take over.
	TakeOver(ctx context.Context, id ID, from, to string, now, until time.Time) (bool, error)

	// Complete ends owner's work on id in one atomic step: it runs commit,
	// the request's effect (nil for none), and if commit succeeds, marks the
	// record COMPLETED with resp. If commit fails, nothing changes and its
	// error is returned. If owner does not hold an IN_PROGRESS record id,
	// commit is not run and the error is [ErrNotOwner].
	//
	// commit runs inside the store's atomic step (under its lock, or inside
	// its transaction, which a SQL store passes in ctx); it must not call
	// the Store.
	Complete(ctx context.Context, id ID, owner string, resp *Response, commit func(context.Context) error) error

	// Release deletes the IN_PROGRESS record id if owner holds it, so that
	// the key is free again. It returns [ErrNotOwner] otherwise.
	Release(ctx context.Context, id ID, owner string) error

	// Sweep deletes every record expired at the store's now (now is the
	// caller's; see [Record.Expired]: never one IN_PROGRESS under a live
	// lease) and returns how many.
	Sweep(ctx context.Context, now time.Time) (int, error)
}

// TxStore is a [Store] that can run a fresh key's whole request in one
// transaction of its own, for handlers whose effect lives in the same
// database ([Config.OneTransaction]): the record, the effect and the
// answer commit once, and a crash before the commit leaves nothing, so no
// IN_PROGRESS record is committed and no lease is needed. Requests for one
// key are kept apart by a lock on the key that is taken without waiting
// and ends with the transaction.
type TxStore interface {
	Store

	// Get returns the live record id, if there is one, at the store's now
	// (now is the caller's, for stores that judge on it). A key whose
	// request runs in RunOnce elsewhere reads as an IN_PROGRESS record
	// with no owner whose lease ends at the store's now, so that a lookup
	// answers "in progress" rather than "nothing was done".
	Get(ctx context.Context, id ID, now time.Time) (rec *Record, found bool, err error)

	// RunOnce runs do for rec.ID inside one transaction, as the only
	// holder of the key's lock, and commits the record COMPLETED with the
	// answer do returns, in that transaction. ctx, as do gets it, carries
	// the transaction (for a SQL store, see its documentation), through
	// which do writes its effect. When the key has a live record, or its
	// lock is held (then existing is rec, IN_PROGRESS, with no owner and
	// rec's lease), do is not run and existing is returned. When the
	// key's record is a lease-mode one, IN_PROGRESS, whose lease has ended
	// and whose fingerprint (and its version) is rec's, RunOnce takes it
	// over in the transaction and passes it to do as abandoned (nil for a
	// fresh key): the COMPLETED record keeps its stable id, and the
	// take-over commits with the work or not at all. When do returns
	// an error, or a nil answer (a server error), the transaction rolls
	// back: nothing is stored. A live record that appears before the
	// commit (a lease-mode worker's) rolls do's effect back and is
	// returned as existing. A store bounds how long it waits for a
	// connection and the first answer, and reports the wait as an error
	// matching context.DeadlineExceeded, with nothing done; a commit with
	// no answer within its bound is reported the same way, and may have
	// committed.
	RunOnce(ctx context.Context, rec *Record, do func(ctx context.Context, abandoned *Record) (*Response, error)) (existing *Record, err error)
}
