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
	outcomeRejected   = "rejected"    // 400 or 415: the body was refused
	outcomeTooLarge   = "too_large"   // 413: body over the limit
	outcomeFailed     = "failed"      // >= 500: no answer stored (see NothingDone)
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
	// Clock gives the durations of a record's lease and retention. A test
	// drives them with a clock.Manual instead of sleeping. The store's
	// clock judges leases, retention and a 409's Retry-After ([Store],
	// [Record.ReadAt]). This one never does, so hosts whose clocks
	// disagree answer alike. Nil means the system clock.
	Clock clock.Clock
	// Retention is how long a record lives, from its CreatedAt. Zero or
	// negative means 24 hours.
	Retention time.Duration
	// Lease is how long a worker holds an IN_PROGRESS record. After it,
	// another request may take the record over. It must exceed the longest
	// time the work takes. Zero or negative means 30 seconds.
	Lease time.Duration
	// Expected is how long the work is expected to take. It sets a 409's
	// Retry-After. Zero means "any moment now" (Retry-After: 1).
	Expected time.Duration
	// RequireUUID accepts only UUIDs in their 36-character form as keys.
	// They are compared in lower case, so a key's case cannot make two
	// records. Without it, keys are compared byte for byte.
	RequireUUID bool
	// MaxBodyBytes limits request bodies, as received and as decoded. A
	// larger body gets 413. Zero means 1 MiB (1 << 20 bytes).
	MaxBodyBytes int64
	// MaxStoredBodyBytes bounds the answer body a record keeps. A larger
	// answer is still sent whole to its request. Its record is still
	// COMPLETED, with its status, Location and Content-Type, but no body.
	// Its replay has that status, an empty body and
	// Idempotent-Body-Omitted: too-large. The key is never freed, so the
	// work never runs twice. Zero or negative means 64 KiB.
	MaxStoredBodyBytes int64
	// Confidential reports whether the answer to r must not be kept at
	// rest in clear. Such an answer shows a secret, like a card number or
	// an API key shown once. Its record keeps the status, Location and
	// Content-Type, never the body. Its replay has that status, an empty
	// body and Idempotent-Body-Omitted: confidential. The key is never
	// freed. Nil keeps every answer within MaxStoredBodyBytes.
	Confidential func(r *http.Request) bool
	// MaxDepth limits how deep the objects and arrays of a JSON body nest.
	// {} is one level. A deeper body gets 400 before [Config.Validate]
	// sees it. Zero or negative means 100. A body nested deeper than 10000
	// levels is not JSON to encoding/json. It is fingerprinted raw and left
	// to Validate.
	MaxDepth int
	// Validate checks the request before the store is asked about its key.
	// So an invalid body is a 400 that stores nothing, even when the key
	// has a record. It returns a nil Problem to accept. It may return the
	// parsed body, which the handler gets as [Info.Validated]. It may read
	// a JSON body from the fingerprint's parse ([JSONReadingOf]). Nil
	// accepts every body.
	Validate func(r *http.Request, body []byte) (parsed any, p *Problem)
	// Principal names the caller that owns a key. It is the account the
	// request acts for, as the server's authentication found it. "" is
	// one anonymous caller. It is required: [New] panics without it.
	//
	// It must not return a credential, such as the Authorization header.
	// An OAuth access token may be refreshed while an intent is
	// unresolved. The retry would then be another caller's. It would
	// find no record for its key, and the work would run twice. Stores
	// keep a digest of the principal, never the value ([PrincipalDigest]).
	Principal func(r *http.Request) string
	// NewStableID returns a new id for an intent ([Record.StableID]). Nil
	// means 26 random base32 characters.
	NewStableID func() string
	// OnOutcome, if not nil, is told how each request was answered, for
	// logs and metrics. The outcome is one of these:
	//
	//   - "created": the work ran and its answer was stored.
	//   - "takeover": as created, after taking over a dead worker's record.
	//   - "replayed": the stored answer was sent.
	//   - "conflict": 409, another request holds the key.
	//   - "reused": 422, the key was used for other content.
	//   - "missing" and "invalid": 400, no key or a malformed key.
	//   - "rejected": 400 or 415, the body was refused.
	//   - "too_large": 413.
	//   - "failed": a server error, and no answer was stored.
	//   - "lost": the worker lost its lease, and its effect was dropped.
	//   - "store_error": the store failed (500), or was too slow (503).
	//   - "full": 503, the store had no room for a new record.
	//
	// A body is refused when Validate refuses it, or it does not decode.
	// A JSON body is also refused without one reading, or outside UTF-8.
	OnOutcome func(r *http.Request, outcome string)
	// OneTransaction runs each fresh key's request in one transaction of
	// the store, which must be a [TxStore] (pgstore's Store is one). The
	// record, the handler's effect and its answer commit once, or not at
	// all.
	//
	// Choose it when every effect of the handler is written in the store's
	// database. The effect uses the transaction the request's context
	// carries, through [OnCommit] or directly (see pgstore.Tx). A crash
	// before the commit then leaves no record and no effect. The retry
	// does the work.
	//
	// Leave it off for a handler that calls anything outside the database,
	// such as a payment provider. That is the lease mode. Only a record
	// committed before the call keeps its stable id. The retry needs that
	// id to ask the provider what was done.
	//
	// A duplicate of a running request answers 409 at once. It waits for
	// no connection. One request per key runs in a process. Across
	// processes, the store's lock on the key is tried without waiting.
	OneTransaction bool
	// Logger gets the store's errors, which the client never sees. A
	// database's message names tables, indexes and settings. So a 500 says
	// only that the server failed. Nil means silent.
	Logger *slog.Logger
}

// middleware makes a handler idempotent under the Idempotency-Key contract.
// It is safe for concurrent use by multiple goroutines.
type middleware struct {
	cfg  Config
	next http.Handler
	// once is the store in the single-transaction mode, nil in the lease
	// mode. flights holds the keys this process runs in that mode.
	once    TxStore
	mu      sync.Mutex
	flights map[ID]*flight
}

// New returns next wrapped in the idempotency layer. The wrapped handler
// keeps the Idempotency-Key contract. It is safe for concurrent use by
// multiple goroutines.
//
// New panics if cfg.Store or cfg.Principal is nil. It also panics if
// cfg.Retention is not longer than cfg.Lease. A record must not expire
// under its live worker.
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
		// A record would expire under its live worker. The next request would
		// replace it with a new stable id and do the work again.
		panic(fmt.Sprintf("idempotency: Config.Retention (%s) must be longer than Config.Lease (%s)", cfg.Retention, cfg.Lease))
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = defaultMaxBodyBytes
	}
	if cfg.MaxStoredBodyBytes <= 0 {
		cfg.MaxStoredBodyBytes = defaultMaxStoredBodyBytes
	}
	if cfg.Principal == nil {
		// There is no default. The only one possible, the raw Authorization
		// value, makes a refreshed token another caller.
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

// ServeHTTP runs the contract's checks, in its table's order. Then it
// runs the protocol of its mode.
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
// answers a missing or malformed key with 400, and returns false.
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

// body reads the request's body within Config.MaxBodyBytes, decoded
// from its Content-Encoding. The request it returns reads as decoded.
// A body too large, unreadable or in an unknown coding is answered
// here, with 413, 400 or 415. Then body returns false.
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
		// The request never arrived whole. That says nothing of the key:
		// it may hold a record that a whole retry replays. So the answer
		// is 408, which asks for the request again, never a final 400.
		m.report(r, outcomeRejected)
		(&Problem{Type: typeRequestIncomplete, Title: "Request incomplete", Status: http.StatusRequestTimeout,
			Detail: "the request body ended before its declared length, or its connection broke; nothing was done; send it again"}).Write(w)
		return r, nil, false
	}
	if codings := r.Header.Values("Content-Encoding"); len(codings) > 0 {
		// A retry compressed again differs in its bytes. So the fingerprint
		// is of the body as the handler reads it.
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

// validate fingerprints the request and runs Config.Validate. It
// answers a body with no single reading, or one Validate refuses, with
// 400 or 415. Then it returns false. Validate's parse goes to the
// handler.
func (m *middleware) validate(w http.ResponseWriter, r *http.Request, body []byte) (fingerprint, any, bool) {
	// The body is parsed once. The fingerprint's reading of a JSON body
	// goes to Validate through the request's Body (see JSONReadingOf). It
	// is dropped when Validate returns.
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
		// The body has no single reading to fingerprint. It is too deep, not
		// UTF-8, or has member names that collide after case folding.
		// Nothing is stored.
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
	// Validate may have read the body, or replaced it. The handler reads
	// it from its start. The reading is dropped, since its memory is
	// reused.
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

// newRecord is the IN_PROGRESS record a fresh key gets. It has a new
// stable id, and its lease and retention start now. In the lease mode it
// has a new owner too. The single-transaction mode holds the key's lock
// instead, and its records have no owner.
func (m *middleware) newRecord(r *http.Request, key string, fp fingerprint, now time.Time) *Record {
	rec := &Record{
		ID:                 ID{Principal: m.cfg.Principal(r), Key: key},
		Fingerprint:        fp,
		FingerprintVersion: fingerprintVersion,
		Status:             StatusInProgress,
		StableID:           m.cfg.NewStableID(),
		LockedUntil:        now.Add(m.cfg.Lease),
		CreatedAt:          now,
		ExpiresAt:          now.Add(m.cfg.Retention),
	}
	if m.once == nil {
		rec.Owner = rand.Text()
	}
	return rec
}

// serveLeased is the lease mode. The request inserts its key's record,
// IN_PROGRESS under a lease, and runs the work as its owner. A key with a
// record is answered from it, or taken over once its lease has ended.
func (m *middleware) serveLeased(w http.ResponseWriter, r *http.Request, rec *Record, parsed any, now time.Time) {
	ctx := r.Context()
	// A lost take-over race means another request now holds the record.
	// A few rounds settle it. After them the answer is a plain 409.
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
// this process, and a duplicate waits for what it finds. The request
// runs the work in one transaction of the store. Or it is answered
// from its key's record.
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
	// RunOnce did not take over this lease-mode record, though its lease
	// ended and its content is the request's. A TxStore takes such a
	// record over itself, so the record changed meanwhile. The work never
	// runs outside RunOnce's transaction. The retry will see how the
	// record ended.
	m.inProgress(w, r, busy(rec), now)
}

// duplicate answers a request whose key this process runs already.
// Until that request has read the record, it waits for what it finds.
// So a replay is shared. Once the work runs, or the key was found
// busy, the answer is 409 at once. No connection is taken either way.
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

// answered answers the request from its key's record, when the record
// settles it. A completed record gets a replay or a 422. So does one
// for other content. A live lease gets 409. A record with the
// request's content whose lease has ended gets no answer. Then
// answered returns false.
func (m *middleware) answered(w http.ResponseWriter, r *http.Request, existing, rec *Record, now time.Time) bool {
	if !sameContent(existing, rec) || existing.Status == StatusCompleted {
		m.answer(w, r, existing, rec)
		return true
	}
	// The lease is judged on the store's clock, when the store read the
	// record. This host's clock is never used.
	at := storeNow(existing, now)
	if existing.LockedUntil.After(at) {
		m.inProgress(w, r, existing, at)
		return true
	}
	return false
}

// takeOver takes existing, whose lease has ended, from its worker. It
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

// answer answers a request from its key's completed record. The answer
// is 422 if the content differs, else the replay.
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

// busy is the record a key reads as while another request runs it in
// one transaction. It is rec, IN_PROGRESS, its lease just begun.
func busy(rec *Record) *Record {
	b := *rec
	b.Status, b.Owner, b.Response = StatusInProgress, "", nil
	return &b
}

// flight is a key run by this process in the single-transaction mode.
// decided is closed once its request starts the work. It is also
// closed once the request has found the key busy, or found its record.
// existing is set before then.
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

// enter returns the flight of id. It reports whether the caller owns
// it, which it does when id was not running.
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

// runOnce does the work of a fresh key in one transaction of the store.
// The key may have a record, or another request may hold it. Then
// runOnce returns that record and answers nothing. Otherwise it has
// answered, or it returns the store's error.
func (m *middleware) runOnce(w http.ResponseWriter, r *http.Request, rec *Record, parsed any, f *flight) (*Record, error) {
	// The request's state is one allocation.
	st := &onceRequest{wk: work{info: Info{ID: rec.ID, StableID: rec.StableID, Validated: parsed}},
		cw: capture{header: make(http.Header)}}
	wk, cw := &st.wk, &st.cw
	// A panic rolls the transaction back, as a dead process does.
	// Nothing is stored, and the key is free.
	existing, err := m.once.RunOnce(r.Context(), rec, func(ctx context.Context, abandoned *Record) (*Response, error) {
		st.ran = true
		f.decide(nil)
		if abandoned != nil {
			// This is a lease-mode record whose lease ended. The work goes
			// on under its stable id, as after a lease's take-over.
			st.takeover = true
			wk.info.StableID, wk.info.Takeover = abandoned.StableID, true
		}
		m.next.ServeHTTP(cw, r.WithContext(context.WithValue(ctx, ctxKey{}, wk)))
		if cw.code() >= 500 {
			return nil, nil
		}
		// The handler has answered. Its effect is recorded even if the
		// client has gone meanwhile.
		if wk.pending() {
			if err := wk.commit(context.WithoutCancel(ctx)); err != nil {
				return nil, err
			}
		}
		return m.stored(r, cw), nil
	})
	takeover, ran := st.takeover, st.ran
	if err == nil {
		f.decide(existing)
	}
	switch {
	case err != nil && !ran && errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		// No connection or first answer came in time. Nothing was done,
		// and the key is free. A late commit is another case, which
		// storeError answers, since it may have committed.
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

// onceRequest is what runOnce keeps for its request: the handler's work
// and answer, and whether the work ran, and as a take-over.
type onceRequest struct {
	wk            work
	cw            capture
	ran, takeover bool
}

// sameContent reports whether rec's request has the existing record's
// content. A record fingerprinted by another version of the algorithm
// never matches. Its fingerprint cannot be compared with the request's.
func sameContent(existing, rec *Record) bool {
	return existing.FingerprintVersion == rec.FingerprintVersion && existing.Fingerprint == rec.Fingerprint
}

// run does the work as the record's owner and commits or releases.
func (m *middleware) run(w http.ResponseWriter, r *http.Request, rec *Record, takeover bool, parsed any) {
	wk := &work{info: Info{ID: rec.ID, StableID: rec.StableID, Takeover: takeover, Validated: parsed}}
	cw := &capture{header: make(http.Header)}
	// A panic is a crashed worker. It leaves the record IN_PROGRESS, as a
	// dead process would, and the lease ends it.
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

// giveUp gives up the record after work that stored no answer. That is
// a server error, or a commit that failed.
//
// The record is kept unless the handler called [NothingDone]. The
// worker may have called a provider under its stable id. Deleting the
// record would give the key a new stable id. The next request would
// charge again under it.
//
// So the record stays, with its lease ended. The next request takes it
// over with the same stable id ([Info.Takeover]). It asks the provider
// first. This is TakeOver from this owner to none, which ends the lease
// at once.
func (m *middleware) giveUp(ctx context.Context, rec *Record, wk *work) error {
	if wk.released() {
		return m.cfg.Store.Release(ctx, rec.ID, rec.Owner)
	}
	now := m.now()
	_, err := m.cfg.Store.TakeOver(ctx, rec.ID, rec.Owner, "", now, now)
	return err
}

// storeNow is the store's now when it read rec, when its lease is
// judged. It is now, this host's, for a store that uses its callers'
// clock.
func storeNow(rec *Record, now time.Time) time.Time {
	if rec.ReadAt.IsZero() {
		return now
	}
	return rec.ReadAt
}

// inProgress answers 409. Retry-After is the time left until the work
// is expected to be done: the lease start plus Config.Expected. It is
// never past the end of the lease. It is whole seconds rounded up, at
// least 1.
func (m *middleware) inProgress(w http.ResponseWriter, r *http.Request, rec *Record, now time.Time) {
	started := rec.LockedUntil.Add(-m.cfg.Lease)
	done := started.Add(m.cfg.Expected)
	if done.After(rec.LockedUntil) {
		done = rec.LockedUntil
	}
	m.report(r, outcomeConflict)
	writeInProgress(w, secondsUntil(done, now))
}

// secondsUntil returns a Retry-After value: the time from now to t. It
// is in whole seconds, rounded up, at least 1.
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
		// The store's wait for the database passed its bound, or a
		// commit got no answer. That commit may have happened. The
		// retry with the key finds what did. The handler's answer may
		// not have been stored, so it is never sent.
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
		// The database is a standby, or refuses writes. Or it rolled the
		// transaction back on a conflict with another. The store can
		// neither say "nothing was done" nor store the answer. The retry
		// with the same key finds what was.
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

// unavailable answers 503 with Retry-After: 1. The store could not
// settle the request now. It was busy, gave no answer, or could not
// decide. err is logged and never shown. detail says why, in words for
// the client. The retry with the same key finds what was done.
func (m *middleware) unavailable(w http.ResponseWriter, r *http.Request, err error, msg, detail string) {
	m.report(r, outcomeStoreError)
	if m.cfg.Logger != nil {
		m.cfg.Logger.LogAttrs(r.Context(), slog.LevelWarn, msg,
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	}
	(&Problem{Type: typeInternal, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: detail + "; retry with the same key after the Retry-After delay"}).Write(withRetryAfter(w, 1))
}

// echoKey marks every answer to r as the server's own. A client tells
// the server's word from a stranger's by this mark. No proxy, CDN or
// gateway in front of the server echoes the key.
//
// Every answer carries the request's Idempotency-Key back, as
// received. It may be bare or quoted, and every field line is kept.
// Fresh answers, replays, 409, 422, a 400 about the key and a 5xx all
// carry it. The key is set before the handler runs, and again on the
// answer. So a handler cannot drop it or answer under another key.
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

// storedHeaders are the response fields a replay needs. Nothing else is
// kept, but headerBodyOmitted on a record that kept no body.
var storedHeaders = []string{"Content-Type", "Location"}

// replay writes a stored response byte for byte, marked as a replay. A
// record that kept no body says so in headerBodyOmitted.
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

// stored is the answer cw captured for r, as its record keeps it. The
// body is left out when it is over the bound or confidential. Then
// headerBodyOmitted says so, and a replay carries it.
func (m *middleware) stored(r *http.Request, cw *capture) *Response {
	switch {
	case m.cfg.Confidential != nil && m.cfg.Confidential(r):
		return cw.response(omittedConfidential)
	case int64(cw.body.Len()) > m.cfg.MaxStoredBodyBytes:
		return cw.response(omittedTooLarge)
	}
	return cw.response("")
}

// response is the captured answer as stored: only what a replay needs.
// It has no body when omitted says why.
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
