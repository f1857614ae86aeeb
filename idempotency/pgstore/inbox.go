package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Inbox makes the consumer of an at-least-once message stream do each
// message's work once. [Inbox.Process] runs the effect and records the
// message id in one transaction. So a message delivered again does
// nothing. That covers a consumer that crashed before acknowledging it,
// and two consumers at once. Its table, idempotency_inbox, is created by
// [Migrate]. An Inbox is safe for concurrent use by multiple goroutines
// and processes.
type Inbox struct {
	pool  *pgxpool.Pool
	batch int
}

// NewInbox returns an Inbox on pool.
func NewInbox(pool *pgxpool.Pool) *Inbox { return &Inbox{pool: pool, batch: defaultSweepBatch} }

// Process runs effect for the message id of consumer, unless it was
// processed before. One transaction records (consumer, id) and runs effect.
// The effect writes its changes through tx. So they commit with the record
// or not at all.
//
// It returns true when effect ran and committed. It returns false, and a
// nil error, when the message had been processed already. Either way the
// message may be acknowledged. An error means the message must not be
// acknowledged. Either nothing was recorded, or the record may not last.
// The message will be delivered again, and processed then unless its
// record lasted. A second delivery during the first waits for it. It then
// does nothing if the first committed. The commit is durable whatever
// synchronous_commit the role has. The effect must not lower it.
func (in *Inbox) Process(ctx context.Context, consumer, id string, effect func(ctx context.Context, tx pgx.Tx) error) (bool, error) {
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("pgstore: process message %q: begin: %w", id, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit, a no-op
	// The insert raises synchronous_commit for the transaction. The
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
	// An operator's cancel of the wait (see ConfigurePool). That is not
	// acknowledged either.
	if err := afterCommit(tx.Conn().PgConn()); err != nil {
		return false, fmt.Errorf("pgstore: process message %q: %w", id, err)
	}
	return true, nil
}

// inboxSweepSQL forgets one batch of at most $3 messages. They were
// processed before the statement's now() less $1. The batch starts from
// the time $2, or from the first when $2 is NULL. It returns how many it
// forgot and the latest time among them. It walks the processed_at index
// as sweepSQL walks expires_at. So a batch costs about the same, however
// many messages the inbox holds.
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

// Sweep forgets the messages processed more than olderThan ago, by the
// database's clock. It works in batches, oldest first, and returns how
// many it forgot. Keep olderThan longer than the broker may take to
// redeliver a message.
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
