package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/clock"
)

// The outcomes, as [Config.OnOutcome] lists them.
const (
	outcomeCreated    = "created"     // the work ran and its answer was stored
	outcomeTakeover   = "takeover"    // as created, after taking over a dead worker's record
	outcomeReplayed   = "replayed"    // the stored answer was replayed
	outcomeConflict   = "conflict"    // 409: another request holds the key
	outcomeReused     = "reused"      // 422: the key was used for other content
	outcomeMissing    = "missing"     // 400: no key
	outcomeInvalid    = "invalid"     // 400: malformed key
	outcomeRejected   = "rejected"    // 400 or 415: the body failed validation, does not decode, or is JSON without one reading or not in UTF-8
	outcomeTooLarge   = "too_large"   // 413: body over the limit
	outcomeFailed     = "failed"      // >= 500: no answer stored; the key is free, or taken over next (see NothingDone)
	outcomeLost       = "lost"        // the worker lost its lease; its effect was discarded
	outcomeStoreError = "store_error" // the store failed
	outcomeFull       = "full"        // 503: the store had no room for a new record; nothing stored
)

// Defaults for a zero [Config], as its fields document them.
const (
	defaultRetention    = 24 * time.Hour
	defaultLease        = 30 * time.Second
	defaultMaxBodyBytes = 1 << 20
	// defaultMaxStoredBodyBytes is the largest answer body a record keeps
	// when [Config.MaxStoredBodyBytes] is zero.
	defaultMaxStoredBodyBytes = 64 << 10
)

// Config configures [New]. Store and Principal are required; every other
// zero field means its default.
type Config struct {
	// Store holds the records. Required.
	Store Store
	// Clock tells the durations the store is given (a record's lease and
	// retention, from its CreatedAt), so tests can drive them without
	// sleeping (a clock.Manual). Leases, retention and the Retry-After
	// of a 409 are judged on the store's clock (see [Store] and
	// [Record.ReadAt]), never on this one: hosts whose clocks disagree
	// answer alike. Nil means the system clock.
	Clock clock.Clock
	// Retention is how long a record lives, from its CreatedAt. Zero or
	// negative means 24 hours.
	Retention time.Duration
	// Lease is how long a worker holds an IN_PROGRESS record before another
	// request may take it over. Zero or negative means 30 seconds.
	// It must exceed the longest time the work takes.
	Lease time.Duration
	// Expected is how long the work is expected to take; it sets the
	// Retry-After of a 409. Zero means "any moment now" (Retry-After: 1).
	Expected time.Duration
	// RequireUUID makes keys that are not UUIDs in their 36-character form
	// invalid, and compares keys by their canonical form (lower case), so
	// that a key's case cannot make two records. Without it, keys are
	// compared byte for byte.
	RequireUUID bool
	// MaxBodyBytes limits request bodies, as received and as decoded from
	// their Content-Encoding; larger ones get 413. Zero means 1 MiB
	// (1 << 20 bytes).
	MaxBodyBytes int64
	// MaxStoredBodyBytes bounds the answer body a record keeps. A larger
	// answer is still sent whole to its request, and its record is still
	// COMPLETED, with its status, Location and Content-Type, but without
	// the body: a replay answers that status with an empty body and
	// Idempotent-Body-Omitted: too-large. The key is never freed, so the
	// work never runs twice. Zero or negative means 64 KiB.
	MaxStoredBodyBytes int64
	// Confidential, if not nil, reports whether the answer to r must not
	// be kept at rest in clear: one that shows a secret (a card number, an
	// API key shown once). Its record keeps the status, Location and
	// Content-Type, never the body; a replay answers that status with an
	// empty body and Idempotent-Body-Omitted: confidential. The key is
	// never freed. Nil keeps every answer within MaxStoredBodyBytes.
	Confidential func(r *http.Request) bool
	// MaxDepth limits how deep the objects and arrays of a JSON body nest
	// ({} is one level); deeper bodies get 400 before [Config.Validate]
	// sees them. Zero or negative means 100. Bodies
	// nested deeper than 10000 levels are not JSON to encoding/json: they are
	// fingerprinted raw and left to Validate.
	MaxDepth int
	// Validate checks the request before its key is looked at in the store,
	// so that an invalid body is a 400 even when the key has a record, and
	// stores nothing. It returns a nil Problem to accept, and may return the
	// parsed body, which the handler gets as [Info.Validated] instead of
	// parsing it again. It may read a JSON body from the fingerprint's
	// parse ([JSONReadingOf]) instead of parsing it. Nil accepts every
	// body.
	Validate func(r *http.Request, body []byte) (parsed any, p *Problem)
	// Principal names the caller that owns a key: the account the request
	// acts for, as the server's authentication found it ("" for one
	// anonymous caller). Required: [New] panics without it. It must not
	// return the credential (such as the Authorization header): a
	// credential that rotates (an OAuth access token, refreshed while an
	// intent is unresolved, or before it is resumed after a restart) would
	// make the retry another caller's, with no record for its key, and the
	// work would run twice. Stores keep a digest of it, never the value
	// (see "Scope" in the package docs).
	Principal func(r *http.Request) string
	// NewStableID returns a new id for an intent (see [Record.StableID]).
	// Nil means 26 random base32 characters.
	NewStableID func() string
	// OnOutcome, if not nil, is told how every request was answered, for
	// logs and metrics: outcome is one of "created" (the work ran and its
	// answer was stored), "takeover" (as created, after taking over a dead
	// worker's record), "replayed", "conflict" (409: another request holds
	// the key), "reused" (422), "missing" and "invalid" (400: no key, a
	// malformed key), "rejected" (400 or 415: the body failed validation,
	// does not decode from its Content-Encoding, or is JSON without one
	// reading or not in UTF-8), "too_large" (413), "failed" (a server
	// error: no answer stored), "lost" (the worker lost its lease; its
	// effect was discarded), "store_error" (the store failed, or did not
	// answer within its bound: a 503 with Retry-After) and "full" (503:
	// the store had no room for a new record).
	OnOutcome func(r *http.Request, outcome string)
	// OneTransaction runs each fresh key's request in one transaction of
	// the store, which must be a [TxStore] (pgstore's is): the record, the
	// handler's effect and its answer commit once, or not at all. Choose it
	// when every effect of the handler is written in the store's database,
	// through the transaction the request's context carries (with
	// [OnCommit], or directly: see pgstore.Tx); a crash before the commit
	// then leaves no record and no effect, and the retry does the work.
	// Leave it off (the lease mode) when the handler calls anything outside
	// the database, such as a payment provider: only a record committed
	// before the call keeps its stable id for the retry to ask the
	// provider about (see "External side effects" in the package docs).
	// A request whose key another request is running answers 409 at once,
	// without waiting for a connection: one request per key runs in a
	// process, and across processes the store's lock on the key is taken
	// without waiting.
	OneTransaction bool
	// Logger gets the store's errors, which the client never sees: a 500
	// answer says only that the server failed, since a database's message
	// names tables, indexes and settings. Nil means silent.
	Logger *slog.Logger
}

// middleware makes a handler idempotent under the Idempotency-Key contract.
// It is safe for concurrent use by multiple goroutines.
type middleware struct {
	cfg  Config
	next http.Handler
	// once is the store in the single-transaction mode, nil in the lease
	// mode; flights holds the keys this process is running in it.
	once    TxStore
	mu      sync.Mutex
	flights map[ID]*flight
}

// New returns next wrapped in the idempotency layer, which makes a handler
// idempotent under the Idempotency-Key contract and is safe for concurrent
// use by multiple goroutines. It panics if
// cfg.Store or cfg.Principal is nil, or if cfg.Retention is not longer
// than cfg.Lease (a record must not expire under its live worker).
func New(next http.Handler, cfg Config) http.Handler {
	if cfg.Store == nil {
		panic("idempotency: Config.Store is nil")
	}
	if cfg.Retention <= 0 {
		cfg.Retention = defaultRetention
	}
	if cfg.Lease <= 0 {
		cfg.Lease = defaultLease
	}
	if cfg.Retention <= cfg.Lease {
		// A record would expire under its live worker, and the next request
		// would replace it with a new stable id and do the work again.
		panic(fmt.Sprintf("idempotency: Config.Retention (%s) must be longer than Config.Lease (%s)", cfg.Retention, cfg.Lease))
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = defaultMaxBodyBytes
	}
	if cfg.MaxStoredBodyBytes <= 0 {
		cfg.MaxStoredBodyBytes = defaultMaxStoredBodyBytes
	}
	if cfg.Principal == nil {
		// No default: the raw Authorization value, the only one there could
		// be, makes a refreshed token another caller (see Config.Principal).
		panic("idempotency: Config.Principal is nil: return the account the request acts for, " +
			"as the server's authentication found it, not its credential (a refreshed token must be the same caller)")
	}
	if cfg.NewStableID == nil {
		cfg.NewStableID = rand.Text
	}
	m := &middleware{cfg: cfg, next: next}
	if cfg.OneTransaction {
		once, ok := cfg.Store.(TxStore)
		if !ok {
			panic(fmt.Sprintf("idempotency: Config.OneTransaction needs a TxStore, and %T is not one", cfg.Store))
		}
		m.once, m.flights = once, make(map[ID]*flight)
	}
	return m
}

func (m *middleware) now() time.Time {
	if m.cfg.Clock == nil {
		return time.Now()
	}
	return m.cfg.Clock.Now()
}

func (m *middleware) report(r *http.Request, o string) {
	if m.cfg.OnOutcome != nil {
		m.cfg.OnOutcome(r, o)
	}
}

// ServeHTTP implements http.Handler: the checks of the contract's table,
// in its order, then the protocol of the mode.
func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w = echoKey(w, r)
	key, ok := m.key(w, r)
	if !ok {
		return
	}
	r, body, ok := m.body(w, r)
	if !ok {
		return
	}
	fp, parsed, ok := m.validate(w, r, body)
	if !ok {
		return
	}
	now := m.now()
	rec := m.newRecord(r, key, fp, now)
	if m.once != nil {
		m.serveOnce(w, r, rec, parsed, now)
		return
	}
	m.serveLeased(w, r, rec, parsed, now)
}

// key returns the request's key, in the form keys are compared in. It
// answers a missing or malformed key with 400 itself, and returns false.
func (m *middleware) key(w http.ResponseWriter, r *http.Request) (string, bool) {
	key, err := parseKeyHeader(r.Header, m.cfg.RequireUUID)
	if errors.Is(err, errKeyMissing) {
		m.report(r, outcomeMissing)
		(&Problem{Type: typeKeyMissing, Title: "Idempotency-Key header missing", Status: http.StatusBadRequest,
			Detail: "this endpoint requires an Idempotency-Key header; create one key per intent and reuse it on every retry"}).Write(w)
		return "", false
	}
	if err != nil {
		m.report(r, outcomeInvalid)
		(&Problem{Type: typeKeyInvalid, Title: "Idempotency-Key invalid", Status: http.StatusBadRequest, Detail: err.Error()}).Write(w)
		return "", false
	}
	return key, true
}

// body reads the request's body within Config.MaxBodyBytes, decoded from
// its Content-Encoding. The request it returns reads as decoded. A body
// too large, unreadable or in an unknown coding is answered here (413,
// 400, 415), and body returns false.
func (m *middleware) body(w http.ResponseWriter, r *http.Request) (*http.Request, []byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			m.report(r, outcomeTooLarge)
			(&Problem{Type: typePayloadTooLarge, Title: "Payload too large", Status: http.StatusRequestEntityTooLarge,
				Detail: fmt.Sprintf("the request body is over the limit of %d bytes", m.cfg.MaxBodyBytes)}).Write(w)
			return r, nil, false
		}
		m.report(r, outcomeRejected)
		(&Problem{Type: typeBadRequest, Title: "Bad request", Status: http.StatusBadRequest, Detail: "the request body could not be read"}).Write(w)
		return r, nil, false
	}
	if codings := r.Header.Values("Content-Encoding"); len(codings) > 0 {
		// The fingerprint is of the body as the handler reads it, not of
		// its compression, which differs on a retry compressed again.
		if body, err = decodeContent(codings, body, m.cfg.MaxBodyBytes); err != nil {
			p := encodingProblem(w, err)
			if p.Status == http.StatusRequestEntityTooLarge {
				m.report(r, outcomeTooLarge)
			} else {
				m.report(r, outcomeRejected)
			}
			p.Write(w)
			return r, nil, false
		}
		r = decoded(r, len(body))
	}
	return r, body, true
}

// validate fingerprints the request and runs Config.Validate. A body with
// no single reading, or one Validate refuses, is answered here (400 or
// 415), and validate returns false. Validate's parse goes to the handler.
func (m *middleware) validate(w http.ResponseWriter, r *http.Request, body []byte) (fingerprint, any, bool) {
	// The body is parsed once: the fingerprint's reading of a JSON body
	// goes to Validate too, through the request's Body (see
	// JSONReadingOf), and is dropped when Validate returns.
	c, err := parseJSON(body, m.cfg.MaxDepth)
	if p := charsetProblem(r.Header.Get("Content-Type"), c != nil || err != nil); p != nil {
		if c != nil {
			c.Release()
		}
		m.report(r, outcomeRejected)
		p.Write(w)
		return fingerprint{}, nil, false
	}
	if err != nil {
		// Too deep, an object whose member names collide after case
		// folding, or text that is not UTF-8: no single reading to
		// fingerprint. Nothing is stored.
		m.report(r, outcomeRejected)
		(&Problem{Type: typeBadRequest, Title: "Bad request", Status: http.StatusBadRequest, Detail: err.Error()}).Write(w)
		return fingerprint{}, nil, false
	}
	fp := fingerprintParsed(r.Method, r.URL.Path, r.URL.RawQuery, body, c)
	rb := newValidateBody(body, c)
	r.Body = rb
	var (
		parsed any
		p      *Problem
	)
	if m.cfg.Validate != nil {
		parsed, p = m.cfg.Validate(r, body)
	}
	// Validate may have read the body, or replaced it: the handler reads
	// it from its start, without the reading, whose memory is reused.
	rb.Reset(body)
	r.Body = rb
	if c != nil {
		c.Release()
	}
	if p != nil {
		m.report(r, outcomeRejected)
		p.Write(w)
		return fingerprint{}, nil, false
	}
	return fp, parsed, true
}

// newRecord is the IN_PROGRESS record a fresh key gets: the caller's
// scope, a new stable id and owner, its lease and retention from now.
func (m *middleware) newRecord(r *http.Request, key string, fp fingerprint, now time.Time) *Record {
	return &Record{
		ID:                 ID{Principal: m.cfg.Principal(r), Key: key},
		Fingerprint:        fp,
		FingerprintVersion: fingerprintVersion,
		Status:             StatusInProgress,
		StableID:           m.cfg.NewStableID(),
		Owner:              rand.Text(),
		LockedUntil:        now.Add(m.cfg.Lease),
		CreatedAt:          now,
		ExpiresAt:          now.Add(m.cfg.Retention),
	}
}

// serveLeased is the lease mode. The request inserts its key's record,
// IN_PROGRESS under a lease, and runs the work as its owner. A key with a
// record is answered from it, or taken over once its lease has ended.
func (m *middleware) serveLeased(w http.ResponseWriter, r *http.Request, rec *Record, parsed any, now time.Time) {
	ctx := r.Context()
	// A lost takeover race means another request now holds the record; a
	// few rounds settle it, after which the answer is a plain 409.
	for range 3 {
		existing, inserted, err := m.cfg.Store.Insert(ctx, rec)
		if err != nil {
			m.storeError(w, r, err)
			return
		}
		if inserted {
			m.run(w, r, rec, false, parsed)
			return
		}
		if m.answered(w, r, existing, rec, now) {
			return
		}
		if m.takeOver(w, r, rec, existing, parsed, now) {
			return
		}
		now = m.now()
		rec.CreatedAt, rec.LockedUntil, rec.ExpiresAt = now, now.Add(m.cfg.Lease), now.Add(m.cfg.Retention)
	}
	m.report(r, outcomeConflict)
	writeInProgress(w, 1)
}

// serveOnce is the single-transaction mode. One request per key runs in
// this process; a duplicate waits for what it finds. The request runs the
// work in one transaction of the store, or is answered from its key's
// record.
func (m *middleware) serveOnce(w http.ResponseWriter, r *http.Request, rec *Record, parsed any, now time.Time) {
	f, owner := m.enter(rec.ID)
	if !owner {
		m.duplicate(w, r, f, rec, now)
		return
	}
	defer m.leave(rec.ID, f)
	existing, err := m.runOnce(w, r, rec, parsed, f)
	if err != nil {
		m.storeError(w, r, err)
		return
	}
	if existing == nil || m.answered(w, r, existing, rec, now) {
		return // answered
	}
	// A lease-mode record whose lease ended, with the request's content,
	// which RunOnce did not take over: a TxStore takes such a record over
	// itself, so this one changed meanwhile. The work never runs outside
	// RunOnce, where its transaction is: the retry will see how the
	// record ended.
	m.inProgress(w, r, busy(rec), now)
}

// duplicate answers a request whose key this process runs already. Until
// that request has read the record, it waits for what it finds: a replay
// is shared. Once it works, or found the key busy, the answer is 409 at
// once. No connection is taken either way.
func (m *middleware) duplicate(w http.ResponseWriter, r *http.Request, f *flight, rec *Record, now time.Time) {
	// f.existing may be read only once decided is closed.
	select {
	case <-f.decided:
		if f.existing != nil && f.existing.Status == StatusCompleted {
			m.answer(w, r, f.existing, rec)
			return
		}
	case <-r.Context().Done():
	}
	m.inProgress(w, r, busy(rec), now)
}

// answered answers the request from its key's record when the record
// settles it: a replay or a 422 once completed or for other content, a
// 409 under a live lease. It returns false, and answers nothing, for a
// record with the request's content whose lease has ended.
func (m *middleware) answered(w http.ResponseWriter, r *http.Request, existing, rec *Record, now time.Time) bool {
	if !sameContent(existing, rec) || existing.Status == StatusCompleted {
		m.answer(w, r, existing, rec)
		return true
	}
	// The lease is judged on the store's clock, at the moment the store
	// read the record: never on this host's.
	at := storeNow(existing, now)
	if existing.LockedUntil.After(at) {
		m.inProgress(w, r, existing, at)
		return true
	}
	return false
}

// takeOver takes existing, whose lease has ended, from its worker, and
// runs the work under its stable id. It returns false, and answers
// nothing, when another request took the record first.
func (m *middleware) takeOver(w http.ResponseWriter, r *http.Request, rec, existing *Record, parsed any, now time.Time) bool {
	ok, err := m.cfg.Store.TakeOver(r.Context(), rec.ID, existing.Owner, rec.Owner, now, now.Add(m.cfg.Lease))
	if err != nil {
		m.storeError(w, r, err)
		return true
	}
	if !ok {
		return false
	}
	rec.StableID = existing.StableID
	rec.CreatedAt = existing.CreatedAt
	m.run(w, r, rec, true, parsed)
	return true
}

// answer answers a request with the record of its key that another
// request completed: 422 if the content differs, else its replay.
func (m *middleware) answer(w http.ResponseWriter, r *http.Request, existing, rec *Record) {
	if !sameContent(existing, rec) {
		m.report(r, outcomeReused)
		(&Problem{Type: typeKeyReused, Title: "Idempotency-Key reused", Status: http.StatusUnprocessableEntity,
			Detail: "this key was already used for a request with a different method, path, query or body; use a new key for a new intent"}).Write(w)
		return
	}
	m.report(r, outcomeReplayed)
	replay(w, existing.Response)
}

// busy is the record a key reads as while another request runs it in one
// transaction: rec, IN_PROGRESS, its lease just begun.
func busy(rec *Record) *Record {
	b := *rec
	b.Status, b.Owner, b.Response = StatusInProgress, "", nil
	return &b
}

// flight is a key run by this process in the single-transaction mode.
// decided is closed once its request starts the work, or has found the
// key's record (existing, set before) or the key busy.
type flight struct {
	decided chan struct{}
	once    sync.Once
	// existing is the record the request found, if it found one.
	existing *Record
}

func (f *flight) decide(existing *Record) {
	f.once.Do(func() {
		f.existing = existing
		close(f.decided)
	})
}

// enter returns the flight of id, and whether the caller is its owner (it
// was not running).
func (m *middleware) enter(id ID) (*flight, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f, ok := m.flights[id]; ok {
		return f, false
	}
	f := &flight{decided: make(chan struct{})}
	m.flights[id] = f
	return f, true
}

func (m *middleware) leave(id ID, f *flight) {
	f.decide(nil)
	m.mu.Lock()
	delete(m.flights, id)
	m.mu.Unlock()
}

// runOnce does the work of a fresh key in one transaction of the store. It
// returns the key's record, without having answered, when the key has one
// or another request holds it; otherwise it has answered (existing and
// err nil), or the store failed (err).
func (m *middleware) runOnce(w http.ResponseWriter, r *http.Request, rec *Record, parsed any, f *flight) (*Record, error) {
	wk := &work{info: Info{ID: rec.ID, StableID: rec.StableID, Validated: parsed}}
	cw := &capture{header: make(http.Header)}
	// A panic rolls the transaction back: nothing is stored, as when the
	// process dies, and the key is free.
	takeover, ran := false, false
	existing, err := m.once.RunOnce(r.Context(), rec, func(ctx context.Context, abandoned *Record) (*Response, error) {
		ran = true
		f.decide(nil)
		if abandoned != nil {
			// A lease-mode worker's record, whose lease ended: the work
			// goes on under its stable id, as after a lease's take-over.
			takeover = true
			wk.info.StableID, wk.info.Takeover = abandoned.StableID, true
		}
		m.next.ServeHTTP(cw, r.WithContext(context.WithValue(ctx, ctxKey{}, wk)))
		if cw.code() >= 500 {
			return nil, nil
		}
		// The handler has answered: its effect is recorded even if the
		// client has gone meanwhile.
		if err := wk.commit(context.WithoutCancel(ctx)); err != nil {
			return nil, err
		}
		return m.stored(r, cw), nil
	})
	if err == nil {
		f.decide(existing)
	}
	switch {
	case err != nil && !ran && errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		// No connection or first answer in time: nothing was done, the
		// key is free. (After the work, a commit with no answer in time
		// may have committed: storeError answers it.)
		m.unavailable(w, r, err, "idempotency: the store is busy",
			"the server has no database connection free, and nothing was done under this key")
		return nil, nil
	case err != nil || existing != nil:
		return existing, err
	case cw.code() >= 500:
		m.report(r, outcomeFailed)
	case takeover:
		m.report(r, outcomeTakeover)
	default:
		m.report(r, outcomeCreated)
	}
	cw.writeTo(w)
	return nil, nil
}

// sameContent reports whether the request of rec has the content of the
// existing record. A record fingerprinted by another version of the
// algorithm (a later release's, or none) never matches: its fingerprint
// cannot be compared with the request's.
func sameContent(existing, rec *Record) bool {
	return existing.FingerprintVersion == rec.FingerprintVersion && existing.Fingerprint == rec.Fingerprint
}

// run does the work as the record's owner and commits or releases.
func (m *middleware) run(w http.ResponseWriter, r *http.Request, rec *Record, takeover bool, parsed any) {
	wk := &work{info: Info{ID: rec.ID, StableID: rec.StableID, Takeover: takeover, Validated: parsed}}
	cw := &capture{header: make(http.Header)}
	// A panic (a crashed worker) leaves the record IN_PROGRESS, exactly as a
	// dead process would; the lease ends it.
	m.next.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), ctxKey{}, wk)))

	// The client may be gone, but finished work is still recorded.
	ctx := context.WithoutCancel(r.Context())
	code := cw.code()
	if code >= 500 {
		if err := m.giveUp(ctx, rec, wk); err != nil && !errors.Is(err, ErrNotOwner) {
			m.storeError(w, r, err)
			return
		}
		m.report(r, outcomeFailed)
		cw.writeTo(w)
		return
	}
	switch err := m.cfg.Store.Complete(ctx, rec.ID, rec.Owner, m.stored(r, cw), wk.commit); {
	case errors.Is(err, ErrNotOwner):
		m.report(r, outcomeLost)
		(&Problem{Type: typeRequestInProgress, Title: "Request in progress", Status: http.StatusConflict,
			Detail: "this request's work was taken over by a later attempt with the same key; retry to get its answer"}).Write(withRetryAfter(w, 1))
		return
	case err != nil:
		_ = m.giveUp(ctx, rec, wk)
		m.storeError(w, r, err)
		return
	}
	if takeover {
		m.report(r, outcomeTakeover)
	} else {
		m.report(r, outcomeCreated)
	}
	cw.writeTo(w)
}

// giveUp gives up the record after work that stored no answer (a server
// error, or a commit that failed). Unless the handler said it did nothing
// outside the store ([NothingDone]), the record is kept: the worker may
// have called an external provider under its stable id, and deleting the
// record would hand the key a new stable id, under which the next request
// would charge again. The record stays, with its lease ended, and the next
// request takes it over ([Info.Takeover]) with the same stable id and asks
// the provider first. (This is TakeOver from this owner to none, which ends
// the lease at once.)
func (m *middleware) giveUp(ctx context.Context, rec *Record, wk *work) error {
	if wk.released() {
		return m.cfg.Store.Release(ctx, rec.ID, rec.Owner)
	}
	now := m.now()
	_, err := m.cfg.Store.TakeOver(ctx, rec.ID, rec.Owner, "", now, now)
	return err
}

// storeNow is the store's now when it read rec, the time its lease is
// judged at; now (this host's) for a store that judges on its callers'
// clock.
func storeNow(rec *Record, now time.Time) time.Time {
	if rec.ReadAt.IsZero() {
		return now
	}
	return rec.ReadAt
}

// inProgress answers 409. Retry-After is the time left until the work is
// expected to be done (the lease start plus Config.Expected), never past the
// end of the lease, in whole seconds rounded up, at least 1.
func (m *middleware) inProgress(w http.ResponseWriter, r *http.Request, rec *Record, now time.Time) {
	started := rec.LockedUntil.Add(-m.cfg.Lease)
	done := started.Add(m.cfg.Expected)
	if done.After(rec.LockedUntil) {
		done = rec.LockedUntil
	}
	m.report(r, outcomeConflict)
	writeInProgress(w, secondsUntil(done, now))
}

// secondsUntil returns the time from now to t in whole seconds, rounded up,
// at least 1: a Retry-After value.
func secondsUntil(t, now time.Time) int64 {
	secs := int64(1)
	if left := t.Sub(now); left > time.Second {
		secs = int64((left + time.Second - 1) / time.Second)
	}
	return secs
}

func withRetryAfter(w http.ResponseWriter, secs int64) http.ResponseWriter {
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return w
}

func writeInProgress(w http.ResponseWriter, secs int64) {
	(&Problem{Type: typeRequestInProgress, Title: "Request in progress", Status: http.StatusConflict,
		Detail: "a request with this key is still being processed; retry after the Retry-After delay"}).Write(withRetryAfter(w, secs))
}

func (m *middleware) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.DeadlineExceeded) {
		// The store's bound on its wait for the database, or a commit
		// with no answer, which may have committed: the retry with the
		// key finds what did. Never the handler's answer, which may not
		// have been stored.
		m.unavailable(w, r, err, "idempotency: the store did not answer in time",
			"the server's database did not answer in time")
		return
	}
	if errors.Is(err, ErrStoreFull) {
		m.report(r, outcomeFull)
		if fe := (*fullError)(nil); errors.As(err, &fe) {
			now := fe.Now
			if now.IsZero() {
				now = m.now()
			}
			withRetryAfter(w, secondsUntil(fe.Until, now))
		}
		(&Problem{Type: typeStorageFull, Title: "Storage full", Status: http.StatusServiceUnavailable,
			Detail: "the server holds as many idempotency records as it may; nothing was stored or done under this key, retry after the Retry-After delay"}).Write(w)
		return
	}
	if errors.Is(err, ErrUnavailable) {
		// A standby, a database refusing writes, or a transaction rolled
		// back on a conflict with another (before or after the handler
		// ran): the store cannot say "nothing was done", nor store the
		// answer. The retry with the same key finds what was.
		m.unavailable(w, r, err, "idempotency: the store cannot complete the request now",
			"the server's database could not complete this request now")
		return
	}
	m.report(r, outcomeStoreError)
	if m.cfg.Logger != nil {
		m.cfg.Logger.LogAttrs(r.Context(), slog.LevelError, "idempotency: the store failed",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	}
	(&Problem{Type: typeInternal, Title: "Internal server error", Status: http.StatusInternalServerError,
		Detail: "the server could not read or write its idempotency records; retry with the same key"}).Write(w)
}

// unavailable answers 503 with Retry-After: 1 for a store that could not
// settle the request now (busy, without answer, or unable to decide), and
// logs err, which is never shown. detail says why, in words for the
// client; the retry with the same key finds what, if anything, was done.
func (m *middleware) unavailable(w http.ResponseWriter, r *http.Request, err error, msg, detail string) {
	m.report(r, outcomeStoreError)
	if m.cfg.Logger != nil {
		m.cfg.Logger.LogAttrs(r.Context(), slog.LevelWarn, msg,
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	}
	(&Problem{Type: typeInternal, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: detail + "; retry with the same key after the Retry-After delay"}).Write(withRetryAfter(w, 1))
}

// echoKey marks every answer to r as the server's own: it carries the
// request's Idempotency-Key back, as received (bare or quoted, every field
// line of it), whatever the answer (fresh, replayed, 409, 422, a 400 about
// the key, a 5xx). A proxy, CDN or gateway in front of the server does not
// echo the key, which is how a client tells the server's word from a
// stranger's. The key is set on w's header fields before the handler runs,
// and set again on the answer, so a handler cannot drop it or answer under
// another key.
func echoKey(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	vals := r.Header.Values(headerKey)
	if len(vals) == 0 {
		return w
	}
	vals = append([]string(nil), vals...)
	w.Header()[headerKey] = vals
	return &echoWriter{ResponseWriter: w, key: vals}
}

// echoWriter puts the received key back on the answer as it is written.
type echoWriter struct {
	http.ResponseWriter
	key []string
}

func (e *echoWriter) WriteHeader(code int) {
	e.ResponseWriter.Header()[headerKey] = e.key
	e.ResponseWriter.WriteHeader(code)
}

func (e *echoWriter) Write(p []byte) (int, error) {
	e.ResponseWriter.Header()[headerKey] = e.key
	return e.ResponseWriter.Write(p)
}

// Unwrap gives http.ResponseController the writer underneath.
func (e *echoWriter) Unwrap() http.ResponseWriter { return e.ResponseWriter }

// storedHeaders are the response fields a replay needs; nothing else is
// kept, but for headerBodyOmitted on a record that kept no body.
var storedHeaders = []string{"Content-Type", "Location"}

// replay writes a stored response byte for byte, marked as a replay. A
// record that kept no body says so in headerBodyOmitted, stored with it.
func replay(w http.ResponseWriter, resp *Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h.Set(headerReplayed, "true")
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(resp.Body)
}

// capture buffers a handler's answer until the middleware has committed it.
type capture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(code int) {
	if c.status == 0 && code >= 200 {
		c.status = code
	}
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(p)
}

func (c *capture) code() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

// The values of headerBodyOmitted: why a record keeps no body.
const (
	omittedTooLarge     = "too-large"    // over Config.MaxStoredBodyBytes
	omittedConfidential = "confidential" // Config.Confidential said so
)

// stored is the answer cw captured for r as its record keeps it: the
// body is left out when it is over the bound or confidential, and the
// record says so in headerBodyOmitted, which a replay carries.
func (m *middleware) stored(r *http.Request, cw *capture) *Response {
	switch {
	case m.cfg.Confidential != nil && m.cfg.Confidential(r):
		return cw.response(omittedConfidential)
	case int64(cw.body.Len()) > m.cfg.MaxStoredBodyBytes:
		return cw.response(omittedTooLarge)
	}
	return cw.response("")
}

// response is the captured answer as stored: only what a replay needs,
// without its body when omitted says why.
func (c *capture) response(omitted string) *Response {
	resp := &Response{StatusCode: c.code(), Header: make(http.Header, 2), Body: c.body.Bytes()}
	for _, f := range storedHeaders {
		if v := c.header.Values(f); len(v) > 0 {
			resp.Header[f] = v
		}
	}
	if omitted != "" {
		resp.Body = nil
		resp.Header.Set(headerBodyOmitted, omitted)
	}
	return resp
}

// writeTo sends the captured answer as a fresh one.
func (c *capture) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range c.header {
		h[k] = v
	}
	h.Del(headerReplayed)
	h.Del(headerBodyOmitted)
	h.Set("Content-Length", strconv.Itoa(c.body.Len()))
	w.WriteHeader(c.code())
	_, _ = w.Write(c.body.Bytes())
}
