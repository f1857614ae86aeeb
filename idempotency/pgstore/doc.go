// Package pgstore is an [idempotency.Store] over PostgreSQL, with
// github.com/jackc/pgx/v5.
//
// # Schema
//
// [Migrate] applies the schema, a versioned migration embedded in the
// package (migrations/0001_records.sql): the table idempotency_records,
// keyed by (caller, key) as its PRIMARY KEY, with the fingerprint, status,
// stable id, lease owner and end, created and expiry times, the stored
// answer, and an index on expires_at for the sweep. Call it at start-up;
// several processes may call it at once.
//
// # Statements
//
// Insert is one INSERT ... ON CONFLICT that inserts the record, or replaces
// one that has expired, and otherwise returns the live one: the PRIMARY KEY
// decides which of many concurrent requests wins, and nothing looks a key
// up before inserting it. TakeOver is one UPDATE conditional on the lease's
// owner and end (a compare-and-swap). Complete is one transaction: it marks
// the record COMPLETED (only if the worker still holds it), runs the
// request's effect with the transaction, and commits; see [Tx]. Sweep
// deletes expired records in bounded batches. Release is one DELETE.
//
// # The effect joins the transaction
//
// A handler behind the middleware registers its effect with
// [idempotency.OnCommit]; the effect gets the transaction from its context:
//
//	idempotency.OnCommit(r.Context(), func(ctx context.Context) error {
//		tx, ok := pgstore.Tx(ctx)
//		if !ok {
//			return errors.New("not running inside pgstore.Store.Complete")
//		}
//		_, err := tx.Exec(ctx, "INSERT INTO payments (id, amount) VALUES ($1, $2)", id, amount)
//		return err
//	})
//
// The payment row and the COMPLETED record then commit together or not at
// all. A lost connection before the commit leaves the record IN_PROGRESS,
// and its lease decides what happens next.
//
// # Messages
//
// [Inbox] gives consumers of at-least-once messages the same guarantee: a
// message's effect and its id commit together, so a redelivered message does
// nothing.
//
// Times are stored as timestamptz, to the microsecond.
package pgstore
