package pgstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
)

// lockDomain separates the keys' advisory locks from every other use of the
// same digest. Changing it lets two versions run one key at once.
const lockDomain = "idem.lock.v1:"

// lockKey is the advisory lock of a key of the caller digested as c.
// It is the first 8 bytes of a SHA-256 of c and the key. Two keys share
// a lock with a chance of one in 2^64. They would then only answer 409
// to each other for a moment. The caller passes c, already digested for
// its statements.
func lockKey(c, key string) int64 {
	// The input is built on the stack when it fits.
	var buf [256]byte
	in := append(append(append(append(buf[:0], lockDomain...), c...), 0), key...)
	sum := sha256.Sum256(in)
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// lockAndMarkSQL tries the key's advisory lock ($1) without waiting. It
// marks the transaction with $2 ([markSetting]). It returns whether the
// server is a standby in recovery, whose miss would run the work again.
// It returns the store's now too: $3, else the database's clock. It runs
// inside RunOnce's transaction, which a pooler keeps on one server
// connection. So the read that follows comes from the server checked
// here. One statement does all four, since each statement costs a portal
// and a result.
const lockAndMarkSQL = `SELECT pg_try_advisory_xact_lock($1), set_config('` + markSetting + `', $2, true), ` +
	recoveringSQL + `, coalesce($3::timestamptz, clock_timestamp())`

// readOnceSQL reads the key's record, if it has one. It is a statement of
// its own, after lockAndMarkSQL. READ COMMITTED then gives it a snapshot
// taken after the lock was tried. So a worker that held the lock and
// committed is seen. The caller judges whether the record is live, on the
// now of lockAndMarkSQL.
const readOnceSQL = `SELECT ` + columns + ` FROM idempotency_records WHERE caller = $1 AND key = $2`

// takeOverOnceSQL locks the record of $1, $2 for RunOnce's transaction. It
// does so only if the record is still owner $3's IN_PROGRESS record, with
// its lease ended and not expired. It says whether it did. It does not
// wait for a row that another transaction holds.
var takeOverOnceSQL = nowSQL(4) + ` SELECT EXISTS (SELECT 1 FROM t, idempotency_records r
	WHERE r.caller = $1 AND r.key = $2 AND r.status = 'IN_PROGRESS' AND r.owner = $3
	AND coalesce(r.locked_until <= t.now, true) AND NOT ` + expiredSQL + `
	FOR UPDATE OF r SKIP LOCKED)`

// onceKeySQL is the key column ($2) of the COMPLETED record that RunOnce
// writes after the handler's statements. The expression serves two more
// ends:
//   - it raises synchronous_commit for the commit that follows
//     ([syncCommitSQL]), since the handler may have lowered it;
//   - it is NULL in a transaction without RunOnce's mark $11, where the
//     handler ended RunOnce's transaction. The write then fails with
//     not_null_violation (see [handlerEnded]), and the COMMIT is skipped.
//
// The raise comes first, so it does not depend on the server's order of
// evaluation. A write that fails commits nothing either way.
const onceKeySQL = `CASE WHEN ` + syncCommitSQL + ` IS NOT NULL
		AND current_setting('` + markSetting + `', true) = $11 THEN $2 END`

// onceColumnsSQL is the columns of the COMPLETED record that RunOnce
// writes. onceNowSQL is its creation time. That is the store's now ($4),
// else the statement's start on the database's clock. One value serves
// both created_at and expires_at.
const (
	onceColumnsSQL = `INSERT INTO idempotency_records AS r (caller, key, fingerprint, status, stable_id, owner, locked_until, created_at, expires_at,
		fingerprint_version, response_status, response_header, response_body)`
	onceNowSQL = `coalesce($4::timestamptz, statement_timestamp())`
	// onceValuesSQL is the record's values, in the order of onceColumnsSQL.
	onceValuesSQL = `$1, ` + onceKeySQL + `, $3, 'COMPLETED', $5, '', NULL, ` + onceNowSQL + `,
		` + onceNowSQL + ` + $6::bigint * interval '1 microsecond', $7, $8, $9, $10`
)

// insertOnceSQL is the COMPLETED record of a key that had no record when
// RunOnce read it. That is the usual case, so it is a plain INSERT ...
// VALUES. ON CONFLICT would cost the server about half as much again. A
// WITH query around the insert would cost about a third more. A record
// that appeared meanwhile makes it fail with unique_violation. A
// transaction without the mark makes it fail with not_null_violation
// (onceKeySQL).
const insertOnceSQL = onceColumnsSQL + `
	VALUES (` + onceValuesSQL + `)`

// onceInsertedSQL fails with division_by_zero unless the record was
// written. So the transaction, and the work's effect with it, cannot
// commit.
const onceInsertedSQL = `
SELECT 1 / (SELECT count(*) FROM ins)::int`

// completeOnceSQL stores the COMPLETED record in the transaction of the
// work. The row replaces an expired record, or the record of owner $12
// that the transaction took over. A live record that appeared meanwhile
// makes it fail (onceInsertedSQL). That can happen since a lease-mode
// worker does not take the key's lock. A transaction without the mark
// fails as in insertOnceSQL.
var completeOnceSQL = `WITH ins AS (
	` + onceColumnsSQL + `
	VALUES (` + onceValuesSQL + `)
	ON CONFLICT (caller, key) DO UPDATE SET
		fingerprint = excluded.fingerprint, status = excluded.status, stable_id = excluded.stable_id, owner = '',
		locked_until = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at,
		fingerprint_version = excluded.fingerprint_version, response_status = excluded.response_status,
		response_header = excluded.response_header, response_body = excluded.response_body
	WHERE ` + strings.ReplaceAll(expiredSQL, "t.now", "excluded.created_at") + `
		OR (r.status = 'IN_PROGRESS' AND r.owner = $12)
	RETURNING 1
)` + onceInsertedSQL

// appeared reports whether err says that a live record of the key
// appeared while the work ran. err is the error of RunOnce's last round
// trip. It is division_by_zero from completeOnceSQL, or unique_violation
// from insertOnceSQL.
func appeared(err error) bool {
	pgErr := (*pgconn.PgError)(nil)
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "22012" || pgErr.Code == "23505" && pgErr.TableName == "idempotency_records"
}

// handlerEnded reports whether err says that the transaction lost
// RunOnce's mark. err is the error of RunOnce's last round trip. The
// record's key was then NULL (see onceKeySQL).
func handlerEnded(err error) bool {
	pgErr := (*pgconn.PgError)(nil)
	return errors.As(err, &pgErr) && pgErr.Code == "23502" && pgErr.TableName == "idempotency_records" && pgErr.ColumnName == "key"
}

// RunOnce implements [idempotency.TxStore]. It runs the whole request of
// a fresh key in one transaction. It begins, tries the key's advisory
// lock without waiting, and reads the record. When the key is free, it
// runs do with the transaction in its context ([Tx]). It then inserts
// the COMPLETED record and commits. That is one commit and one flush.
// The commit is durable whatever synchronous_commit the role or the
// handler chose (see [syncCommitSQL]).
//
// On a standby nothing runs, and the error matches
// [idempotency.ErrUnavailable]. The effect must go through the
// transaction only. A second connection would not see the uncommitted
// work, and its writes would not roll back with it. When the lock is
// held, the transaction ends at once and the connection goes back to
// the pool. So a duplicate never waits holding a connection. A crash
// before the commit leaves neither the record nor the effect.
//
// The first answer (BEGIN, the lock and the read) comes within
// [Options.AcquireTimeout]. Otherwise RunOnce does nothing, and its error
// matches context.DeadlineExceeded. The commit's answer comes within
// [Options.CommitTimeout]. Otherwise the error matches
// context.DeadlineExceeded, and the work may have committed.
//
// RunOnce takes over a lease-mode record whose lease has ended, if its
// fingerprint is rec's. Its row stays locked until the commit. A
// lease-mode worker that reaches it meanwhile waits, then finds it
// COMPLETED. do gets it as abandoned. The COMPLETED record keeps its
// stable id. A row that another transaction holds is not waited for. The
// key then reads as busy.
func (s *Store) RunOnce(ctx context.Context, rec *idempotency.Record, do func(ctx context.Context, abandoned *idempotency.Record) (*idempotency.Response, error)) (*idempotency.Record, error) {
	// One bound covers the wait for a connection and for the first
	// answer on it. Behind PgBouncer the pool's connection comes at once.
	// The wait is then in PgBouncer's queue.
	actx, cancel := s.firstAnswer(ctx)
	defer cancel()
	conn, err := s.pool.Acquire(actx)
	if err != nil {
		return nil, fmt.Errorf("pgstore: run key %q: acquire a connection: %w", rec.ID.Key, unanswered(err, s.acquire))
	}
	defer conn.Release()
	// The transaction is marked with a setting of its own, which ends
	// with it. So a handler that ends it and begins another leaves a
	// transaction without the mark.
	run := &onceRun{s: s, conn: conn, rec: rec, caller: caller(rec.ID), mark: rand.Text()}
	run.tx.conn = conn.Conn()
	defer run.rollback(ctx)
	if err := run.begin(actx); err != nil {
		return nil, err
	}
	cancel()
	answer, abandoned, err := run.claim(ctx)
	if answer != nil || err != nil {
		return answer, err
	}
	tx := &run.tx
	defer tx.end() // before the connection goes back to the pool
	resp, err := do(context.WithValue(ctx, txKey{}, tx), abandoned)
	// A handler that tried to end the transaction fails, whatever it
	// answered. The mark catches one that sent COMMIT or ROLLBACK as
	// SQL, since the record's insert checks it.
	if tx.endTried {
		return nil, fmt.Errorf("pgstore: run key %q: %w", rec.ID.Key, errHandlerEnded)
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: run key %q: the effect failed, nothing was stored: %w", rec.ID.Key, conflicted(err))
	}
	if resp == nil {
		return nil, nil // rolled back by the deferred ROLLBACK
	}
	return run.commit(ctx, resp, abandoned)
}

// onceRun is one call of [Store.RunOnce]. It holds the connection, the
// transaction's mark, and what the first round trip read.
type onceRun struct {
	s      *Store
	conn   *pgxpool.Conn
	rec    *idempotency.Record
	caller string // rec's caller, digested
	mark   string // the transaction's mark (see markSetting)

	// What begin read: whether the lock was taken, whether the server is
	// a standby, the store's now, and the key's row.
	locked, recovering bool
	now                time.Time
	row                nullableRecord

	ended bool // the transaction has ended: nothing to roll back

	// tx is the transaction as the handler sees it.
	tx onceTx

	// The round trips' statements and arguments live here, with the run.
	// pgx's Batch.Queue would allocate each statement and grow its list.
	queued  [3]pgx.QueuedQuery
	batch   [3]*pgx.QueuedQuery
	b       pgx.Batch
	args    [12]any
	readArg [2]any
	dest    [11]any // where the key's row is scanned
	// The caller, the key and the mark, boxed once for both round trips.
	callerArg, keyArg, markArg any
}

// newBatch is a pgx batch of qs, held by o. Each element of qs gives the
// SQL and the arguments of one statement.
func (o *onceRun) newBatch(qs ...pgx.QueuedQuery) *pgx.Batch {
	n := copy(o.queued[:], qs)
	for i := range n {
		o.batch[i] = &o.queued[i]
	}
	o.b = pgx.Batch{QueuedQueries: o.batch[:n]}
	return &o.b
}

// rollback ends a transaction that did not commit. A panic in the handler
// rolls back here too. A connection that failed is closed, not given back
// to the pool. The server then rolls back.
func (o *onceRun) rollback(ctx context.Context) {
	if !o.ended {
		rctx, cancel := o.s.commitAnswer(ctx)
		defer cancel()
		_, _ = o.conn.Exec(rctx, "ROLLBACK")
	}
}

// begin sends BEGIN, the lock and the look at the key's record in one
// round trip. The look is a statement of its own, after the lock. READ
// COMMITTED gives it a snapshot taken after the lock. So a worker that
// held the lock and committed is seen.
func (o *onceRun) begin(actx context.Context) error {
	o.callerArg, o.keyArg, o.markArg = o.caller, o.rec.ID.Key, o.mark
	o.args[0], o.args[1], o.args[2] = lockKey(o.caller, o.rec.ID.Key), o.markArg, o.s.now()
	o.readArg[0], o.readArg[1] = o.callerArg, o.keyArg
	b := o.newBatch(pgx.QueuedQuery{SQL: "BEGIN"},
		pgx.QueuedQuery{SQL: lockAndMarkSQL, Arguments: o.args[:3]},
		pgx.QueuedQuery{SQL: readOnceSQL, Arguments: o.readArg[:]})
	// The results are read in order, without a callback each.
	br := o.conn.SendBatch(actx, b)
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&o.locked, nil, &o.recovering, &o.now)
	}
	if err == nil {
		if err = br.QueryRow().Scan(o.row.destInto(&o.dest)...); errors.Is(err, pgx.ErrNoRows) {
			err = nil // no record: row stays all NULL
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgstore: run key %q: begin, lock and read: %w", o.rec.ID.Key, conflicted(unanswered(err, o.s.acquire)))
	}
	return nil
}

// claim decides, from what begin read, whether the work runs. It may
// return the record to answer with: done, under a live lease, another
// request's, or busy. Otherwise it returns the lease-mode record the
// transaction took over, if any. The record, the effect and the take-over
// then commit together.
func (o *onceRun) claim(ctx context.Context) (answer, abandoned *idempotency.Record, err error) {
	rec, now := o.rec, o.now
	if o.recovering {
		return nil, nil, fmt.Errorf("pgstore: run key %q: %w", rec.ID.Key, errRecovering)
	}
	// existing is the key's live record, if any. It is judged on the
	// store's now as the lock was tried.
	var existing *idempotency.Record
	if o.row.status != nil {
		if existing, err = o.row.record(rec.ID); err != nil {
			return nil, nil, fmt.Errorf("pgstore: run key %q: %w", rec.ID.Key, err)
		}
		if existing.Expired(now) {
			existing = nil
		}
	}
	switch {
	case existing != nil:
		existing.ReadAt = now
		if existing.Status != idempotency.StatusInProgress || existing.LockedUntil.After(now) ||
			existing.Fingerprint != rec.Fingerprint || existing.FingerprintVersion != rec.FingerprintVersion {
			return existing, nil, nil // done, under a live lease, or another request's
		}
		if !o.locked {
			return o.busy(), nil, nil
		}
		// The lease has ended: its worker died or gave the record up.
		// The row is locked until the commit, without waiting. A
		// lease-mode worker that reaches it meanwhile waits, then finds
		// it COMPLETED.
		var taken bool
		tctx, cancel := o.s.firstAnswer(ctx)
		err = o.conn.QueryRow(tctx, takeOverOnceSQL, o.caller, rec.ID.Key, existing.Owner, o.s.now()).Scan(&taken)
		cancel()
		if err != nil {
			return nil, nil, fmt.Errorf("pgstore: run key %q: take over: %w", rec.ID.Key, conflicted(unanswered(err, o.s.acquire)))
		}
		if !taken {
			return o.busy(), nil, nil // it changed meanwhile: the retry will see how
		}
		return nil, existing, nil
	case !o.locked:
		return o.busy(), nil, nil
	}
	return nil, nil, nil
}

// busy is the record the key reads as while another transaction holds it.
// It is rec, IN_PROGRESS, without owner.
func (o *onceRun) busy() *idempotency.Record {
	b := *o.rec
	b.Status, b.Owner, b.Response = idempotency.StatusInProgress, "", nil
	return &b
}

// commit writes the COMPLETED record with resp and commits. The work is
// done, so it is recorded even if the client has gone. The record and
// the COMMIT travel together in one round trip. If the record fails, the
// server skips the COMMIT. The transaction then stays open, failed, for
// the rollback. A commit with no answer within CommitTimeout may have
// committed. The error says so. pgx closes the connection on the
// deadline, and it is not given back.
func (o *onceRun) commit(ctx context.Context, resp *idempotency.Response, abandoned *idempotency.Record) (*idempotency.Record, error) {
	rec, conn := o.rec, o.conn
	code, header, body, err := answerColumns(resp)
	if err != nil {
		return nil, fmt.Errorf("pgstore: run key %q: %w", rec.ID.Key, err)
	}
	wctx, wcancel := o.s.commitAnswer(ctx)
	defer wcancel()
	stableID, from := rec.StableID, (*string)(nil)
	if abandoned != nil {
		stableID, from = abandoned.StableID, &abandoned.Owner
	}
	// The write raises synchronous_commit after the handler's statements,
	// which may have lowered it. So the answer is sent once the commit is
	// durable (see onceKeySQL).
	o.args = [12]any{o.callerArg, o.keyArg, rec.Fingerprint[:], o.s.now(), stableID,
		micros(rec.ExpiresAt.Sub(rec.CreatedAt)), rec.FingerprintVersion, code, header, body, o.markArg}
	write, args := insertOnceSQL, o.args[:11]
	if o.row.status != nil || abandoned != nil {
		o.args[11] = from
		write, args = completeOnceSQL, o.args[:] // a record to replace, or one taken over
	}
	b := o.newBatch(pgx.QueuedQuery{SQL: write, Arguments: args}, pgx.QueuedQuery{SQL: "COMMIT"})
	beforeCommit(conn.Conn().PgConn())
	err = conn.SendBatch(wctx, b).Close()
	switch {
	case err == nil:
		return nil, o.committed(wctx)
	case handlerEnded(err) || appeared(err):
		return o.rolledBack(wctx, err)
	}
	// A serialization failure or a deadlock rolled everything back. Under
	// repeatable read or serializable, a duplicate whose snapshot predates
	// the first request's commit meets its record here. The retry finds
	// the record.
	return nil, fmt.Errorf("pgstore: run key %q: store the record and commit: %w", rec.ID.Key, conflicted(unanswered(err, o.s.commit)))
}

// committed checks a COMMIT that the server answered. It checks that the
// transaction ended within its bound. It checks that no operator cut its
// wait for a standby.
func (o *onceRun) committed(wctx context.Context) error {
	rec, conn := o.rec, o.conn
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		return fmt.Errorf("pgstore: run key %q: commit: the transaction is still open (status %c)", rec.ID.Key, st)
	}
	o.ended = true
	if err := wctx.Err(); err != nil {
		// The bound ended while the commit waited. A pool that sends
		// cancel requests makes PostgreSQL confirm such a commit, cut
		// short before a standby had it. It gets no 201.
		return fmt.Errorf("pgstore: run key %q: commit: %w", rec.ID.Key, unanswered(errCanceledCommit(err), o.s.commit))
	}
	// An operator's cancel of the wait: only its warning tells.
	if err := afterCommit(conn.Conn().PgConn()); err != nil {
		return fmt.Errorf("pgstore: run key %q: commit: %w", rec.ID.Key, err)
	}
	return nil
}

// rolledBack ends a transaction whose record's write failed (err). Either
// the handler ended the transaction, or a live record appeared. The work
// rolls back. In the second case the record answers.
func (o *onceRun) rolledBack(wctx context.Context, err error) (*idempotency.Record, error) {
	rec := o.rec
	o.ended = true
	if _, rerr := o.conn.Exec(wctx, "ROLLBACK"); rerr != nil {
		return nil, fmt.Errorf("pgstore: run key %q: roll back: %w", rec.ID.Key, rerr)
	}
	if handlerEnded(err) {
		return nil, fmt.Errorf("pgstore: run key %q: %w", rec.ID.Key, errHandlerEnded)
	}
	existing, found, err := o.s.get(wctx, o.conn, rec.ID)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("pgstore: run key %q: a record appeared and went while the work ran", rec.ID.Key)
	}
	return existing, nil
}
