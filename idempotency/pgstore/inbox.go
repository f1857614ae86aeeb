package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Inbox makes the consumer of an at-least-once message stream do each
// message's work once: [Inbox.Process] runs the effect and records the
// message id in one transaction, so a message delivered again (after a
// consumer crashed before acknowledging it, or to two consumers at once)
// does nothing. Its table, idempotency_inbox, is created by [Migrate].
// An Inbox is safe for concurrent use by multiple goroutines and processes.
type Inbox struct {
	pool  *pgxpool.Pool
	batch int
}

// NewInbox returns an Inbox on pool.
func NewInbox(pool *pgxpool.Pool) *Inbox { return &Inbox{pool: pool, batch: defaultSweepBatch} }

// Process runs effect for the message id of consumer unless it was
// processed before. In one transaction it records (consumer, id) and runs
// effect with that transaction; the effect writes its changes through tx,
// so they commit with the record or not at all.
//
// It returns true when effect ran and committed, false (and a nil error)
// when the message had been processed already; either way the message may be
// acknowledged. An error means nothing was recorded (the effect failed, or
// the database did), or the record may not last (ctx ended while the
// commit waited for a synchronous standby): the message must not be
// acknowledged. It will be delivered again, and processed then unless its
// record lasted. A second delivery that arrives while the first is being
// processed waits for it, then does nothing if it committed. The commit is durable whatever synchronous_commit the role
// has, unless the effect lowers it in its transaction.
func (in *Inbox) Process(ctx context.Context, consumer, id string, effect func(ctx context.Context, tx pgx.Tx) error) (bool, error) {
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("pgstore: process message %q: begin: %w", id, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit, a no-op
	// The insert raises synchronous_commit for the transaction: the
	// message is acknowledged once Process returns, so its record must
	// survive a crash (see syncCommitSQL). An effect must not lower it.
	tag, err := tx.Exec(ctx, `WITH durable AS (SELECT `+syncCommitSQL+`)
		INSERT INTO idempotency_inbox (consumer, message_id) SELECT $1, $2 FROM durable
		ON CONFLICT (consumer, message_id) DO NOTHING`, consumer, id)
	if err != nil {
		return false, fmt.Errorf("pgstore: process message %q: record its id: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if err := effect(ctx, tx); err != nil {
		return false, fmt.Errorf("pgstore: process message %q: the effect failed, nothing was recorded: %w", id, err)
	}
	beforeCommit(tx.Conn().PgConn())
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("pgstore: process message %q: commit: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		// Not acknowledged: a redelivery finds the record if it lasted.
		return false, fmt.Errorf("pgstore: process message %q: %w", id, errCanceledCommit(err))
	}
	// An operator's cancel of the wait (see ConfigurePool): not
	// acknowledged either.
	if err := afterCommit(tx.Conn().PgConn()); err != nil {
		return false, fmt.Errorf("pgstore: process message %q: %w", id, err)
	}
	return true, nil
}

// inboxSweepSQL forgets one batch of messages processed before the
// statement's now() less $1, at most $3, from the time $2 on (NULL: from
// the first), and returns how many and the latest time among them. As
// sweepSQL for the records, it walks the processed_at index in order from
// the previous batch's last time, and deletes the rows it locked by their
// ctid, so that a batch costs about the same however many messages the
// inbox holds.
const inboxSweepSQL = `WITH gone AS (
	DELETE FROM idempotency_inbox
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM idempotency_inbox
		WHERE processed_at >= coalesce($2::timestamptz, '-infinity')
			AND processed_at < now() - $1::interval
		ORDER BY processed_at
		LIMIT $3
		FOR UPDATE SKIP LOCKED))
	RETURNING processed_at
)
SELECT count(*), max(processed_at) FROM gone`

// Sweep forgets the messages processed more than olderThan ago (by the
// database's clock), in batches, oldest first, and returns how many. Keep
// olderThan longer than the longest time the broker may redeliver a
// message.
func (in *Inbox) Sweep(ctx context.Context, olderThan time.Duration) (int, error) {
	total := 0
	var from *time.Time
	for {
		var (
			n    int
			last *time.Time
		)
		if err := in.pool.QueryRow(ctx, inboxSweepSQL, olderThan, from, in.batch).Scan(&n, &last); err != nil {
			return total, fmt.Errorf("pgstore: sweep the inbox (%d deleted so far): %w", total, err)
		}
		total += n
		if n < in.batch {
			return total, nil
		}
		from = last
	}
}
