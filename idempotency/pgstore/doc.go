// Package pgstore is an [idempotency.Store] over PostgreSQL, with
// github.com/jackc/pgx/v5.
//
// docs/SERVER.md tells the schema, durability, migrations, retention and
// sizing in full.
//
// # Schema
//
// [Migrate] applies the migrations embedded in the package, each once, in
// order. Call it at start-up. Several processes may call it at once. It
// refuses a database that records a migration it does not have, such as
// one made by a newer version. It changes nothing there.
//
// Teams that run goose or golang-migrate pass [Migrations] to their tool.
// Those files hold the same statements. Use one tool per database, since
// each records what it applied in a table of its own.
//
// The caller column holds [idempotency.PrincipalDigest] of the principal.
// So the table shows no credential, and a principal of any length fits
// the key.
//
// # Statements
//
// Each store call is one statement or one transaction. The PRIMARY KEY
// decides which of many concurrent inserts wins. Nothing looks a key up
// before inserting it. Complete runs the request's effect inside the
// transaction that marks the record COMPLETED; see [Tx].
//
// The store takes only transaction-scoped locks and settings. So it works
// in any of pgx's query modes, and behind PgBouncer's transaction pooling.
//
// # The effect joins the transaction
//
// A handler behind the middleware registers its effect with
// [idempotency.OnCommit]. The effect gets the transaction from its context:
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
// all. A lost connection before the commit leaves the record IN_PROGRESS.
// Its lease then decides what happens next.
//
// Only the store ends that transaction. Its Commit and Rollback fail. An
// effect that calls either fails its request, whatever it returns. So does
// one that sends COMMIT or ROLLBACK as SQL. The client then gets 500, and
// no answer is stored. The retry takes the record over with the same
// stable id. No answer is ever stored for an effect that did not commit
// with it. Nested transactions (Begin, [pgx.BeginFunc]) are savepoints,
// free to commit and roll back. LargeObjects is not available.
//
// # Messages
//
// [Inbox] gives consumers of at-least-once messages the same guarantee. A
// message's effect and its id commit together. So a redelivered message
// does nothing.
//
// # Durability and replication
//
// The middleware acts on a record once its commit returns. So each of the
// store's commits raises synchronous_commit to at least on. It does so
// inside the transaction, never for the session, which a pooler would
// share.
//
// Build the pool with [ConfigurePool]. It lets the store see a commit
// whose wait for a standby was canceled. The store answers such a commit
// as one with no answer. [Open] warns about a pool built without it.
//
// [Open] (or [Store.Check] after [New]) checks the server once. It refuses
// fsync off. It refuses a primary whose streaming standbys are all
// asynchronous, unless [Options.Replication] accepts the risk.
//
// A read that decides an answer fails on a standby. So does a
// serialization failure or a deadlock. Both errors match
// [idempotency.ErrUnavailable], and the middleware answers 503 with
// Retry-After.
//
// # One clock
//
// Leases and retention are judged on the database's clock. So every
// process judges them alike, whatever its host's clock says.
// [Options.Clock] replaces that clock for tests. Every store on the
// database must then share it.
//
// # One transaction
//
// With [idempotency.Config.OneTransaction], the middleware runs a fresh
// key's request through [Store.RunOnce]. One transaction then holds the
// key's advisory lock, the handler's writes through [Tx] and the COMPLETED
// record. So a fresh key costs one commit. A duplicate in another process
// fails to take the lock and answers 409 at once. [Store.Get] tries the
// same lock, so a lookup answers "in progress" while the work runs. A
// crash before the commit leaves neither record nor effect.
//
// Only RunOnce ends that transaction. A handler that commits or rolls it
// back fails its request, as an effect does under Complete. The
// two modes share the table. RunOnce takes over a lease-mode record once
// its lease has ended.
//
// # Every wait is bounded
//
// [Options.AcquireTimeout] (2 s) bounds the wait for the database's first
// answer. [Options.CommitTimeout] (10 s) bounds the commit's answer and
// every rollback. Past either bound the error matches
// context.DeadlineExceeded. The middleware then answers 503 with
// Retry-After. A commit with no answer may have committed. Its connection
// is closed, never given back to the pool. So closing the pool does not
// hang.
//
// # Sweeping
//
// [Store.Sweep] deletes expired records in bounded batches, by the store's
// clock. Its now argument is not used. [Inbox.Sweep] deletes the message
// ids processed more than olderThan ago. Pass the broker's redelivery
// window. Run either from one process or from all of them.
package pgstore
