package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
)

// Defaults for a zero [Options], as its fields document them.
const (
	// defaultSweepBatch is the most records (or inbox rows) one sweep
	// statement deletes.
	defaultSweepBatch = 1000
	// defaultAcquireTimeout bounds a store call's wait for a connection
	// and the database's first answer.
	defaultAcquireTimeout = 2 * time.Second
	// defaultCommitTimeout is how long a commit waits for its answer.
	defaultCommitTimeout = 10 * time.Second
)

// Store is an [idempotency.Store] over PostgreSQL. Create its table with
// [Migrate] first. A Store is safe for concurrent use by multiple
// goroutines. Several processes may share one database, since one
// statement or one transaction makes every decision.
//
// Leases and retention are judged on the database's clock, for every
// process alike. [Options.Clock] may replace it.
//
// The caller column holds the [idempotency.PrincipalDigest] of each
// record's principal, never the principal. A principal is often a
// credential. The digest also keeps the primary key's entries small.
// Error messages name the key and what was being done, never the caller.
type Store struct {
	pool    *pgxpool.Pool
	batch   int
	acquire time.Duration
	commit  time.Duration
	clock   clock.Clock // nil: the database's clock

	replication Replication
	logger      *slog.Logger
}

// Options configures [New]. A nil *Options means defaults.
type Options struct {
	// SweepBatch is how many expired records one statement of Sweep
	// deletes at most. Zero or negative means 1000.
	SweepBatch int
	// AcquireTimeout bounds a store call's wait for the database's first
	// answer. That is a connection from the pool and the first round trip
	// on it. Behind PgBouncer, it includes the wait in PgBouncer's queue.
	// It bounds Insert, TakeOver, Release and Get whole. It bounds the
	// start of RunOnce and Complete. Past it, the error matches
	// context.DeadlineExceeded, and the middleware answers 503 with
	// Retry-After. The handler has not run then. An Insert or TakeOver
	// whose answer was lost may still have committed. Its record then
	// waits IN_PROGRESS for its lease to end. Zero or negative means 2
	// seconds.
	AcquireTimeout time.Duration
	// CommitTimeout bounds the commit's wait for its answer. It covers
	// RunOnce's last round trip and Complete's effect and commit. A commit
	// with no answer in time may have committed. The error then matches
	// context.DeadlineExceeded, and the connection is closed, never given
	// back to the pool. The middleware answers 503 with Retry-After, never
	// the handler's answer. The retry finds what committed. Commits wait
	// while a synchronous standby is gone. So this bound is what a request
	// waits then. Zero or negative means 10 seconds.
	CommitTimeout time.Duration
	// Clock, if not nil, replaces the database's clock for leases and
	// retention. The store then sends its time with every statement. It is
	// for tests, to move time without waiting (a clock.Manual). Every store
	// on the database must then share the clock. Otherwise hosts whose
	// clocks disagree may both hold one record. Nil means the database's
	// clock_timestamp().
	Clock clock.Clock
	// Replication declares the database's replication, which
	// [Store.Check] cannot fully see. Zero means [ReplicationDetect].
	Replication Replication
	// Logger receives [Store.Check]'s warnings. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// New returns a Store on pool. nil opts means defaults. New does not look
// at the database: [Open] does, with [Store.Check].
func New(pool *pgxpool.Pool, opts *Options) *Store {
	s := &Store{pool: pool, batch: defaultSweepBatch, acquire: defaultAcquireTimeout, commit: defaultCommitTimeout, logger: slog.Default()}
	if opts != nil && opts.SweepBatch > 0 {
		s.batch = opts.SweepBatch
	}
	if opts != nil && opts.AcquireTimeout > 0 {
		s.acquire = opts.AcquireTimeout
	}
	if opts != nil && opts.CommitTimeout > 0 {
		s.commit = opts.CommitTimeout
	}
	if opts != nil {
		s.clock = opts.Clock
		s.replication = opts.Replication
	}
	if opts != nil && opts.Logger != nil {
		s.logger = opts.Logger
	}
	return s
}

// firstAnswer is ctx bounded by AcquireTimeout. It bounds the wait for a
// connection and the database's first answer on it.
func (s *Store) firstAnswer(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.acquire)
}

// commitAnswer is ctx bounded by CommitTimeout, without ctx's
// cancellation. It is for work that is recorded even if the client has
// gone: the commit, Complete's effect, a rollback.
func (s *Store) commitAnswer(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.commit)
}

// unanswered says that err's round trip got no answer within bound. It
// still matches context.DeadlineExceeded.
func unanswered(err error, bound time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer from the database within %s: %w", bound, err)
	}
	return err
}

// now is the time statements judge by. Nil stands for the database's
// clock_timestamp(); see nowSQL.
func (s *Store) now() *time.Time {
	if s.clock == nil {
		return nil
	}
	t := s.clock.Now()
	return &t
}

// nowSQL is the store's now in a statement whose parameter n is [Store.now].
// A WITH query that calls clock_timestamp() runs once per statement.
func nowSQL(n int) string {
	return fmt.Sprintf("WITH t AS (SELECT coalesce($%d::timestamptz, clock_timestamp()) AS now)", n)
}

// micros is d as whole microseconds, the unit of a timestamptz.
// Statements add it to the store's now as $n * interval '1 microsecond'.
func micros(d time.Duration) int64 { return d.Microseconds() }

// leaseMicros is rec's lease in microseconds from its creation. It is nil
// when rec has no lease.
func leaseMicros(rec *idempotency.Record) *int64 {
	if rec.LockedUntil.IsZero() {
		return nil
	}
	m := micros(rec.LockedUntil.Sub(rec.CreatedAt))
	return &m
}

var (
	_ idempotency.TxStore = (*Store)(nil)
)

type txKey struct{}

// Tx returns the transaction of the call that gave ctx. That call is
// [Store.Complete], running an effect, or [Store.RunOnce], running a
// request. Tx returns false when ctx comes from neither. An effect registered with
// [idempotency.OnCommit] writes its business rows through it. So does the
// handler in the single-transaction mode. The rows then commit with the
// COMPLETED record or not at all. The effect must not commit or roll back
// the transaction. It must not write through another connection. A
// handler or effect that ends it anyway fails its request with a server
// error. Nothing is then stored, in either mode. See the package docs.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// expiredSQL is true for a record r expired at t.now, on the database's
// clock. Its retention has ended, and it is not IN_PROGRESS under a live
// lease. See [idempotency.Record.Expired].
const expiredSQL = `(r.expires_at <= t.now AND NOT (r.status = 'IN_PROGRESS' AND coalesce(r.locked_until > t.now, false)))`

const columns = `fingerprint, fingerprint_version, status, stable_id, owner, locked_until, created_at, expires_at,
	response_status, response_header, response_body`

// insertSQL inserts the record, or replaces one that has expired. When it
// does neither, the live record comes back. Its times are the store's now
// ($8), plus the lease ($7) and the retention ($9) in microseconds. The
// now comes back too. The statement is its own transaction. It makes its
// commit durable ([syncCommitSQL]), since the handler runs once it
// returns.
//
// The insert is ON CONFLICT DO NOTHING, which takes no lock on a live
// record. So replays of one key do not queue behind each other. An
// expired record is replaced by an UPDATE conditional on the expiry. The
// UPDATE locks the row and checks the expiry again on its latest version.
// So two requests cannot both replace it.
//
// The main query reads from the statement's snapshot. That snapshot may
// miss a row another transaction committed after the statement began.
// The row then comes back all NULLs, or as its old expired version.
// Insert then runs the statement again.
// expired version) and Insert runs the statement again.
var insertSQL = nowSQL(8) + `, ins AS (
	INSERT INTO idempotency_records (caller, key, fingerprint, status, stable_id, owner, locked_until, created_at, expires_at,
		fingerprint_version)
	SELECT $1, $2, $3, $4, $5, $6, t.now + $7::bigint * interval '1 microsecond', t.now,
		t.now + $9::bigint * interval '1 microsecond', $10
	FROM t
	ON CONFLICT (caller, key) DO NOTHING
	RETURNING 1
), repl AS (
	UPDATE idempotency_records r SET
		fingerprint = $3, status = $4, stable_id = $5, owner = $6,
		locked_until = t.now + $7::bigint * interval '1 microsecond', created_at = t.now,
		expires_at = t.now + $9::bigint * interval '1 microsecond',
		fingerprint_version = $10, response_status = NULL, response_header = NULL, response_body = NULL
	FROM t
	WHERE r.caller = $1 AND r.key = $2 AND ` + expiredSQL + ` AND NOT EXISTS (SELECT 1 FROM ins)
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM ins) OR EXISTS (SELECT 1 FROM repl), t.now,
	r.fingerprint, r.fingerprint_version, r.status, r.stable_id, r.owner, r.locked_until, r.created_at, r.expires_at,
	r.response_status, r.response_header, r.response_body, ` + syncCommitSQL + `
FROM t
LEFT JOIN idempotency_records r ON r.caller = $1 AND r.key = $2
	AND NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM repl)`

// insertAttempts bounds the re-runs of insertSQL while the conflicting
// row is not yet visible. Each re-run takes a new snapshot, so one is
// almost always enough.
const insertAttempts = 10

// Insert implements [idempotency.Store] with one statement: INSERT ... ON
// CONFLICT DO NOTHING, and an UPDATE that replaces an expired record.
func (s *Store) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	ctx, cancel := s.firstAnswer(ctx)
	defer cancel()
	// A connection of its own, since only its notices tell of a commit
	// confirmed after its wait for a synchronous standby was canceled.
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("pgstore: insert key %q: acquire a connection: %w", rec.ID.Key, unanswered(err, s.acquire))
	}
	defer conn.Release()
	for range insertAttempts {
		var (
			inserted bool
			now      time.Time
			row      nullableRecord
		)
		beforeCommit(conn.Conn().PgConn())
		err := conn.QueryRow(ctx, insertSQL, caller(rec.ID), rec.ID.Key, rec.Fingerprint[:], string(rec.Status),
			rec.StableID, rec.Owner, leaseMicros(rec), s.now(), micros(rec.ExpiresAt.Sub(rec.CreatedAt)), rec.FingerprintVersion,
		).Scan(append(append([]any{&inserted, &now}, row.dest()...), nil)...)
		if err != nil {
			return nil, false, fmt.Errorf("pgstore: insert key %q: %w", rec.ID.Key, unanswered(readOnly(err), s.acquire))
		}
		if inserted {
			if err := ctx.Err(); err != nil {
				return nil, false, fmt.Errorf("pgstore: insert key %q: %w", rec.ID.Key, errCanceledCommit(err))
			}
			// An operator's cancel of the wait: the handler must not run.
			if err := afterCommit(conn.Conn().PgConn()); err != nil {
				return nil, false, fmt.Errorf("pgstore: insert key %q: %w", rec.ID.Key, err)
			}
			return nil, true, nil
		}
		if row.status == nil {
			continue // the conflicting row committed after the snapshot
		}
		existing, err := row.record(rec.ID)
		if err != nil {
			return nil, false, fmt.Errorf("pgstore: insert key %q: %w", rec.ID.Key, err)
		}
		if existing.Expired(now) {
			continue // an old version, replaced after the snapshot
		}
		existing.ReadAt = now
		return existing, false, nil
	}
	return nil, false, fmt.Errorf("pgstore: insert key %q: the record changed under %d attempts", rec.ID.Key, insertAttempts)
}

// takeOverSQL gives the IN_PROGRESS record of $1, $2 from owner $3 to
// owner $4. The new lease runs $6 microseconds from the store's now ($5).
// The record must not have expired. Its lease must have ended, unless $4
// is empty, which gives it up at once. The statement is its own
// transaction. RETURNING makes its commit durable ([syncCommitSQL]), for
// the row it changes only. The handler runs once it returns.
var takeOverSQL = nowSQL(5) + ` UPDATE idempotency_records r
		SET owner = $4, locked_until = t.now + $6::bigint * interval '1 microsecond'
		FROM t
		WHERE r.caller = $1 AND r.key = $2 AND r.status = 'IN_PROGRESS' AND r.owner = $3
		AND ($4 = '' OR r.locked_until <= t.now) AND NOT ` + expiredSQL + `
		RETURNING ` + syncCommitSQL

// TakeOver implements [idempotency.Store] with one conditional UPDATE.
// Its commit is durable, as Insert's is. A lost take-over would let
// another worker take the record over again.
func (s *Store) TakeOver(ctx context.Context, id idempotency.ID, from, to string, now, until time.Time) (bool, error) {
	ctx, cancel := s.firstAnswer(ctx)
	defer cancel()
	// Its own connection, as Insert's, since only its notices tell of a
	// canceled wait for a synchronous standby.
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("pgstore: take over key %q: acquire a connection: %w", id.Key, unanswered(err, s.acquire))
	}
	defer conn.Release()
	beforeCommit(conn.Conn().PgConn())
	tag, err := conn.Exec(ctx, takeOverSQL, caller(id), id.Key, from, to, s.now(), micros(until.Sub(now)))
	if err != nil {
		return false, fmt.Errorf("pgstore: take over key %q: %w", id.Key, unanswered(readOnly(err), s.acquire))
	}
	if tag.RowsAffected() != 1 {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("pgstore: take over key %q: %w", id.Key, errCanceledCommit(err))
	}
	// An operator's cancel of the wait: the handler must not run.
	if err := afterCommit(conn.Conn().PgConn()); err != nil {
		return false, fmt.Errorf("pgstore: take over key %q: %w", id.Key, err)
	}
	return true, nil
}

// beginSQL begins Get's transaction. Its read must have a snapshot taken
// after the key's lock was tried. Only READ COMMITTED gives that. Under
// repeatable read or serializable, the snapshot is taken at the first
// statement, before the lock. It would then miss a record that the lock's
// holder committed meanwhile: a lookup's false miss. So the level is
// stated, never inherited from default_transaction_isolation.
const beginSQL = "BEGIN ISOLATION LEVEL READ COMMITTED"

// holdSQL marks Complete's transaction with $4 (see [markSetting]). It
// locks the record of $1, $2 if owner $3 holds it IN_PROGRESS, and says
// whether it does. So the effect runs only for the record's owner. No
// other worker changes the record until the commit.
const holdSQL = `SELECT set_config('` + markSetting + `', $4, true), EXISTS (SELECT 1 FROM idempotency_records
	WHERE caller = $1 AND key = $2 AND status = 'IN_PROGRESS' AND owner = $3 FOR UPDATE)`

// completeSQL marks the record COMPLETED with its answer, in the
// transaction marked $7 only. It runs after the effect. So an effect that
// ended the transaction with SQL leaves the record IN_PROGRESS. That
// covers COMMIT, ROLLBACK and beginning another transaction. The
// statement travels with the COMMIT. When it changes no row, it fails
// with division_by_zero. The server then skips the COMMIT. So the effect
// cannot commit without its record.
const completeSQL = `WITH upd AS (UPDATE idempotency_records
	SET status = 'COMPLETED', owner = '', locked_until = NULL,
		response_status = $4, response_header = $5, response_body = $6
	WHERE caller = $1 AND key = $2 AND status = 'IN_PROGRESS' AND owner = $3
	AND current_setting('` + markSetting + `', true) = $7
	RETURNING 1)
SELECT 1 / (SELECT count(*) FROM upd)::int`

// Complete implements [idempotency.Store] in one transaction. It locks
// the record, only if owner holds it IN_PROGRESS. It runs commit with the
// transaction in its context (see [Tx]). Then it marks the record
// COMPLETED and commits. If commit fails, or the connection is lost before
// the commit, the transaction rolls back. The record then stays IN_PROGRESS, owner's,
// until its lease ends.
//
// BEGIN travels with the record's lock, and the record's update with the
// COMMIT. That is two round trips besides the effect's own. So the effect
// gets the connection inside a transaction block, as in [Store.RunOnce].
// Its nested transactions are savepoints. Its LargeObjects is not
// available, since pgx builds that only on a transaction of its own.
//
// The effect must not end the transaction. Its Commit and Rollback fail.
// An effect that calls either makes Complete fail with nothing stored. So
// does one that sends COMMIT or ROLLBACK as SQL, which the mark catches.
// That holds whatever the effect returned. The record then stays
// IN_PROGRESS, owner's. After a COMMIT sent as SQL, the effect's earlier
// writes have committed on their own.
// The record then stays IN_PROGRESS, owner's; after a COMMIT sent as SQL,
// the effect's writes before it have committed on their own.
func (s *Store) Complete(ctx context.Context, id idempotency.ID, owner string, resp *idempotency.Response, commit func(context.Context) error) error {
	code, header, body, err := answerColumns(resp)
	if err != nil {
		return fmt.Errorf("pgstore: complete key %q: %w", id.Key, err)
	}
	actx, cancel := s.firstAnswer(ctx)
	defer cancel()
	conn, err := s.pool.Acquire(actx)
	if err != nil {
		return fmt.Errorf("pgstore: complete key %q: acquire a connection: %w", id.Key, unanswered(err, s.acquire))
	}
	defer conn.Release()
	ended := false
	defer func() {
		// A panic in the effect rolls back here too. A connection left
		// in a transaction is closed, not given back to the pool. The
		// server then rolls back.
		if !ended {
			rctx, cancel := s.commitAnswer(ctx)
			defer cancel()
			_, _ = conn.Exec(rctx, "ROLLBACK")
		}
	}()
	var (
		mark = rand.Text()
		held bool
	)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(holdSQL, caller(id), id.Key, owner, mark).QueryRow(func(r pgx.Row) error { return r.Scan(nil, &held) })
	// Under repeatable read or serializable, another worker's take-over
	// committed while the lock was awaited makes the lock fail. conflicted
	// reports that serialization failure.
	if err := conn.SendBatch(actx, b).Close(); err != nil {
		return fmt.Errorf("pgstore: complete key %q: lock the record: %w", id.Key, conflicted(unanswered(err, s.acquire)))
	}
	cancel()
	if !held {
		return idempotency.ErrNotOwner
	}
	// The effect and the commit share one bound. A commit with no answer
	// within it may have committed, and its connection is closed.
	ctx, ccancel := s.commitAnswer(ctx)
	defer ccancel()
	if commit != nil {
		etx := &onceTx{conn: conn.Conn()}
		defer etx.end() // before the connection goes back to the pool
		err := commit(context.WithValue(ctx, txKey{}, pgx.Tx(etx)))
		// An effect that tried to end the transaction fails, whatever it
		// returned. The mark catches one that sent COMMIT or ROLLBACK as
		// SQL.
		if etx.endTried {
			return fmt.Errorf("pgstore: complete key %q: %w", id.Key, errHandlerEnded)
		}
		if err != nil {
			return fmt.Errorf("pgstore: complete key %q: the effect failed, nothing was stored: %w", id.Key, conflicted(err))
		}
	}
	ended, err = s.markCompleted(ctx, conn, id, owner, mark, code, header, body)
	return err
}

// markCompleted marks the record COMPLETED with its answer and commits,
// in one round trip, after the effect. It reports whether the transaction
// has ended. If not, Complete's deferred ROLLBACK ends it.
func (s *Store) markCompleted(ctx context.Context, conn *pgxpool.Conn, id idempotency.ID, owner, mark string,
	code, header any, body []byte) (ended bool, err error) {
	var (
		marked bool
		one    int
	)
	b := &pgx.Batch{}
	b.Queue(markedSQL, mark).QueryRow(func(r pgx.Row) error { return r.Scan(&marked) })
	b.Queue(completeSQL, caller(id), id.Key, owner, code, header, body, mark).QueryRow(func(r pgx.Row) error { return r.Scan(&one) })
	// After the effect, which may have lowered it. The answer is sent
	// once the commit is durable.
	b.Queue(`SELECT ` + syncCommitSQL)
	b.Queue("COMMIT")
	beforeCommit(conn.Conn().PgConn())
	err = conn.SendBatch(ctx, b).Close()
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "22012" {
		// The server skipped the COMMIT. The deferred ROLLBACK ends the
		// transaction, or any the effect began since. The record stays.
		if !marked {
			return false, fmt.Errorf("pgstore: complete key %q: %w", id.Key, errHandlerEnded)
		}
		return false, fmt.Errorf("pgstore: complete key %q: the effect changed the record it runs for; nothing was stored", id.Key)
	}
	if err != nil {
		return false, fmt.Errorf("pgstore: complete key %q: commit: mark completed: %w", id.Key, conflicted(unanswered(err, s.commit)))
	}
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		return false, fmt.Errorf("pgstore: complete key %q: commit: the transaction is still open (status %c)", id.Key, st)
	}
	if err := ctx.Err(); err != nil {
		// As in RunOnce, a commit confirmed after its bound may not have
		// reached a synchronous standby.
		return true, fmt.Errorf("pgstore: complete key %q: commit: %w", id.Key, unanswered(errCanceledCommit(err), s.commit))
	}
	// An operator's cancel of the wait: only its warning tells.
	if err := afterCommit(conn.Conn().PgConn()); err != nil {
		return true, fmt.Errorf("pgstore: complete key %q: commit: %w", id.Key, err)
	}
	return true, nil
}

// answerColumns is resp as the response_status, response_header and
// response_body columns. code is an int32 and header a string, or both
// nil for no answer. pgx encodes plain values without reflection.
//
// The header goes as text, not bytes. A pool may send parameters as text,
// as the simple protocol does. Bytes would then go as a bytea literal,
// which is not JSON.
func answerColumns(resp *idempotency.Response) (code, header any, body []byte, err error) {
	if resp == nil {
		return nil, nil, nil, nil
	}
	body = resp.Body
	if body == nil {
		body = []byte{}
	}
	h, err := headerJSON(resp.Header)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encode the answer's header: %w", err)
	}
	return int32(resp.StatusCode), h, body, nil
}

// headerJSON is h as json.Marshal writes it. A stored header has a field
// or two of plain ASCII. Those are written here, with keys sorted as
// json.Marshal sorts them, and no reflection. Anything else goes to
// json.Marshal.
func headerJSON(h http.Header) (string, error) {
	var keys [4]string
	n := 0
	for k, v := range h {
		if n == len(keys) || v == nil || !plainJSON(k) {
			return marshalHeader(h)
		}
		for _, s := range v {
			if !plainJSON(s) {
				return marshalHeader(h)
			}
		}
		// Insertion sort: a handful of keys.
		i := n
		for ; i > 0 && keys[i-1] > k; i-- {
			keys[i] = keys[i-1]
		}
		keys[i] = k
		n++
	}
	if h == nil {
		return "null", nil
	}
	var buf [256]byte
	out := append(buf[:0], '{')
	for i, k := range keys[:n] {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(append(append(out, '"'), k...), `":[`...)
		for j, s := range h[k] {
			if j > 0 {
				out = append(out, ',')
			}
			out = append(append(append(out, '"'), s...), '"')
		}
		out = append(out, ']')
	}
	return string(append(out, '}')), nil
}

// plainJSON reports whether s is written in JSON as itself in quotes:
// printable ASCII that json.Marshal does not escape.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

func marshalHeader(h http.Header) (string, error) {
	b, err := json.Marshal(h)
	return string(b), err
}

// releaseSQL deletes the IN_PROGRESS record of $1, $2 if owner $3 holds
// it. It makes its commit durable, in RETURNING, as takeOverSQL does.
const releaseSQL = `DELETE FROM idempotency_records
		WHERE caller = $1 AND key = $2 AND status = 'IN_PROGRESS' AND owner = $3
		RETURNING ` + syncCommitSQL

// Release implements [idempotency.Store] with one DELETE. Its commit is
// durable, as every other commit of the store is. A release that did not
// reach a synchronous standby is reported as unconfirmed. That error
// matches context.DeadlineExceeded. The key may then stay IN_PROGRESS
// until its lease ends.
func (s *Store) Release(ctx context.Context, id idempotency.ID, owner string) error {
	ctx, cancel := s.firstAnswer(ctx)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: release key %q: acquire a connection: %w", id.Key, unanswered(err, s.acquire))
	}
	defer conn.Release()
	beforeCommit(conn.Conn().PgConn())
	tag, err := conn.Exec(ctx, releaseSQL, caller(id), id.Key, owner)
	if err != nil {
		return fmt.Errorf("pgstore: release key %q: %w", id.Key, unanswered(err, s.acquire))
	}
	if tag.RowsAffected() == 0 {
		return idempotency.ErrNotOwner
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: release key %q: %w", id.Key, errCanceledCommit(err))
	}
	if err := afterCommit(conn.Conn().PgConn()); err != nil {
		return fmt.Errorf("pgstore: release key %q: %w", id.Key, err)
	}
	return nil
}

// sweepSQL deletes one batch of expired records, at most $3, on the
// store's now ($1). It starts from expiry $2, or from the first when $2
// is NULL. It returns how many it deleted and the latest expiry among
// them.
//
// It walks the expires_at index from $2 in order. The store's now reaches
// the index as a scalar subquery, computed once. So both ends of the walk
// are index conditions. ORDER BY makes the index the cheapest plan,
// whatever the planner estimates. The DELETE then reaches each row by its
// address (ctid, a TID scan). The row is locked from the walk on, so it
// cannot move. And no join can tempt the planner to read every expired
// record. So a batch reads about its own rows, however large the table.
// Starting from the last batch's expiry skips the dead index entries
// behind it. The expiry is checked again on the row the DELETE finds.
var sweepSQL = nowSQL(1) + `, gone AS (
	DELETE FROM idempotency_records r
	WHERE r.ctid = ANY (ARRAY(
		SELECT r.ctid FROM idempotency_records r
		WHERE r.expires_at >= coalesce($2::timestamptz, '-infinity') AND ` + expiredNowSQL + `
		ORDER BY r.expires_at
		LIMIT $3
		FOR UPDATE OF r SKIP LOCKED))
	AND ` + expiredNowSQL + `
	RETURNING r.expires_at
)
SELECT count(*), max(expires_at) FROM gone`

// expiredNowSQL is expiredSQL with the store's now as a scalar subquery
// of t. The planner can put such a value in an index condition.
var expiredNowSQL = strings.ReplaceAll(expiredSQL, "t.now", "(SELECT now FROM t)")

// Sweep implements [idempotency.Store], on the store's clock. It deletes
// in batches of [Options.SweepBatch] records, oldest expiry first. Each
// batch is its own statement, so no transaction stays open for long. Each
// batch costs about the same, however many live records the table holds.
// Records that another transaction holds locked are left for the next
// sweep. If ctx ends between batches, Sweep returns what it deleted so
// far and ctx's error.
func (s *Store) Sweep(ctx context.Context, now time.Time) (int, error) {
	total := 0
	var from *time.Time
	for {
		var (
			n    int
			last *time.Time
		)
		if err := s.pool.QueryRow(ctx, sweepSQL, s.now(), from, s.batch).Scan(&n, &last); err != nil {
			return total, fmt.Errorf("pgstore: sweep expired records (%d deleted so far): %w", total, err)
		}
		total += n
		if n < s.batch {
			return total, nil
		}
		from = last
	}
}

// Get implements [idempotency.TxStore] on the store's clock. It returns
// the record id if it is live. The caller's now is not used. found is
// false when there is none.
//
// A key whose [Store.RunOnce] holds its lock reads as IN_PROGRESS with no
// owner. Its lease ends at the store's now. Get tries the lock before it
// reads the record. The try is shared, does not wait, and ends at once.
// So a worker that commits between the two is seen by the read. On a
// standby, which may lag the primary, Get fails with an error matching
// [idempotency.ErrUnavailable].
func (s *Store) Get(ctx context.Context, id idempotency.ID, now time.Time) (rec *idempotency.Record, found bool, err error) {
	ctx, cancel := s.firstAnswer(ctx)
	defer cancel()
	rec, found, err = s.get(ctx, s.pool, id)
	if err != nil {
		return nil, false, fmt.Errorf("pgstore: get key %q: %w", id.Key, unanswered(err, s.acquire))
	}
	return rec, found, nil
}

// get is Get through q, in one round trip.
func (s *Store) get(ctx context.Context, q interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, id idempotency.ID) (rec *idempotency.Record, found bool, err error) {
	var (
		free, recovering bool
		dbNow            time.Time
		row              nullableRecord
	)
	c := caller(id)
	b := &pgx.Batch{}
	// The lock and the read are statements of their own in a READ
	// COMMITTED transaction (see beginSQL). So the read's snapshot is
	// taken after the lock was tried.
	b.Queue(beginSQL)
	b.Queue(`SELECT pg_try_advisory_xact_lock_shared($1)`, lockKey(c, id.Key)).QueryRow(func(r pgx.Row) error { return r.Scan(&free) })
	b.Queue(nowSQL(3)+` SELECT `+recoveringSQL+`, t.now, `+columns+` FROM t
		LEFT JOIN idempotency_records r ON r.caller = $1 AND r.key = $2 AND NOT `+expiredSQL, c, id.Key, s.now()).
		QueryRow(func(r pgx.Row) error { return r.Scan(append([]any{&recovering, &dbNow}, row.dest()...)...) })
	b.Queue("COMMIT")
	if err = q.SendBatch(ctx, b).Close(); err != nil {
		return nil, false, err
	}
	if recovering {
		return nil, false, errRecovering
	}
	switch {
	case row.status != nil:
		if rec, err = row.record(id); err != nil {
			return nil, false, err
		}
		rec.ReadAt = dbNow
		return rec, true, nil
	case !free:
		return &idempotency.Record{ID: id, Status: idempotency.StatusInProgress, LockedUntil: dbNow, CreatedAt: dbNow, ExpiresAt: dbNow,
			ReadAt: dbNow}, true, nil
	}
	return nil, false, nil
}

// nullableRecord is a record's columns as scanned, NULLs and all.
type nullableRecord struct {
	fingerprint  []byte
	fpVersion    *int16
	status       *string
	stableID     *string
	owner        *string
	lockedUntil  *time.Time
	createdAt    *time.Time
	expiresAt    *time.Time
	responseCode *int32
	header       []byte
	body         []byte
}

func (n *nullableRecord) dest() []any {
	return n.destInto(new([11]any))
}

// destInto is dest in buf, which a caller may hold already.
func (n *nullableRecord) destInto(buf *[11]any) []any {
	*buf = [11]any{&n.fingerprint, &n.fpVersion, &n.status, &n.stableID, &n.owner, &n.lockedUntil, &n.createdAt, &n.expiresAt,
		&n.responseCode, &n.header, &n.body}
	return buf[:]
}

func (n *nullableRecord) record(id idempotency.ID) (*idempotency.Record, error) {
	if n.status == nil || n.stableID == nil || n.owner == nil || n.createdAt == nil || n.expiresAt == nil {
		return nil, errors.New("a record's column is NULL")
	}
	rec := &idempotency.Record{ID: id, Status: *n.status, StableID: *n.stableID, Owner: *n.owner,
		CreatedAt: *n.createdAt, ExpiresAt: *n.expiresAt}
	if copy(rec.Fingerprint[:], n.fingerprint) != len(rec.Fingerprint) || len(n.fingerprint) != len(rec.Fingerprint) {
		return nil, fmt.Errorf("the fingerprint is %d bytes, not %d", len(n.fingerprint), len(rec.Fingerprint))
	}
	if n.fpVersion != nil {
		rec.FingerprintVersion = int(*n.fpVersion)
	}
	if n.lockedUntil != nil {
		rec.LockedUntil = *n.lockedUntil
	}
	if n.responseCode != nil {
		rec.Response = &idempotency.Response{StatusCode: int(*n.responseCode), Body: n.body}
		if rec.Response.Body == nil {
			rec.Response.Body = []byte{}
		}
		if len(n.header) > 0 && string(n.header) != "null" {
			if err := json.Unmarshal(n.header, &rec.Response.Header); err != nil {
				return nil, fmt.Errorf("the stored answer's header: %w", err)
			}
		}
		if rec.Response.Header == nil {
			rec.Response.Header = http.Header{}
		}
	}
	return rec, nil
}

// caller is the caller column of id: its principal's digest.
func caller(id idempotency.ID) string { return idempotency.PrincipalDigest(id.Principal) }
