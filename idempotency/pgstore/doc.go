// Package pgstore is an [idempotency.Store] over PostgreSQL, with
// github.com/jackc/pgx/v5.
//
// # Schema
//
// [Migrate] applies the schema from versioned migrations embedded in the
// package (migrations/NNNN_name.sql), each once, in order, and records them
// in idempotency_schema_migrations. The first release's schema is one
// migration, 0001. Its table idempotency_records is keyed by (caller, key)
// as its PRIMARY KEY, with the fingerprint and its version, status, stable
// id, lease owner and end, created and expiry times, the stored answer,
// and an index on expires_at for the sweep; idempotency_inbox holds the
// ids of processed messages. Call Migrate at start-up; several processes
// may call it at once. Migrate refuses a database that records a
// migration it does not have, such as one made by a newer version: it
// changes nothing there.
//
// Teams that run their migrations with goose or golang-migrate pass
// [Migrations] to their tool instead: the same statements, in files those
// tools read. Use one tool per database, since each records what it applied
// in a table of its own.
//
// The caller column holds [idempotency.PrincipalDigest] of the principal
// (64 hex characters), never the principal: SELECT caller FROM
// idempotency_records shows no credential, and a principal of any length
// fits the primary key. The fingerprint_version column says which
// algorithm made the fingerprint (see "Fingerprint" in the idempotency
// package docs).
//
// # Statements
//
// Insert is one INSERT ... ON CONFLICT that inserts the record, or replaces
// one that has expired, and otherwise returns the live one: the PRIMARY KEY
// decides which of many concurrent requests wins, and nothing looks a key
// up before inserting it. TakeOver is one UPDATE conditional on the lease's
// owner and end (a compare-and-swap). Complete is one transaction: it locks
// the record (only if the worker still holds it), runs the request's
// effect with the transaction, marks the record COMPLETED and commits; see
// [Tx]. Sweep deletes expired records in bounded batches. Release is one
// DELETE. RunOnce is the single transaction of a fresh key (see "One
// transaction").
//
// The statements work on a pool in any of pgx's query modes, the simple
// protocol and the modes without prepared statements included (a pool
// behind PgBouncer's transaction pooling needs one of those): the store
// takes only transaction-scoped locks and settings, and sends no
// parameter whose meaning depends on the mode.
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
// Only Complete ends that transaction: the effect must neither commit it
// nor roll it back. Its Commit and Rollback fail, and an effect that calls
// either fails its request whatever it returns: the client gets 500 and no
// answer is stored. So does one that sends COMMIT or ROLLBACK as SQL
// through the transaction or its connection: the transaction carries the
// mark of "One transaction", and the record is marked COMPLETED after the
// effect, in the marked transaction only, so no answer is ever stored for
// an effect that did not commit with it. The record stays IN_PROGRESS and
// the middleware ends its lease at once (as after any server error; or
// deletes it, after [idempotency.NothingDone]): the retry takes it over
// with the same stable id and does the work. After a ROLLBACK nothing was
// done; after a COMMIT sent as SQL, the effect written before it has
// committed on its own, without the record, and the retry does it again.
// Nested transactions (Begin, [pgx.BeginFunc]) are savepoints and may be
// committed and rolled back freely. LargeObjects is not available in
// either mode: the store begins the transaction together with the
// record's lock, in one round trip, which pgx's own Begin cannot do.
//
// # Messages
//
// [Inbox] gives consumers of at-least-once messages the same guarantee: a
// message's effect and its id commit together, so a redelivered message does
// nothing.
//
// # Durability and replication
//
// The middleware acts on a record once its commit returns: the handler
// runs on the IN_PROGRESS record, and the answer is sent for the
// COMPLETED one. So each of the store's own commits (the IN_PROGRESS
// insert, a take-over, a release, the completion, RunOnce's commit, the
// inbox's) raises
// synchronous_commit to at least on inside its transaction, with
// set_config(..., true), never a session SET, which a pooler would pass
// to other clients: a role or server with synchronous_commit off or
// local does not weaken them, and remote_apply is kept. RunOnce and
// Complete raise it with the COMMIT, after the handler's or effect's
// statements, which may have lowered it. An insert whose request ended
// while its commit was being confirmed fails: PostgreSQL ends a commit's
// wait for a synchronous standby when the query is canceled, and
// reports the commit done though the standby may lack it.
//
// An operator's pg_cancel_backend on a stuck commit ends its wait the same
// way, while the request's context lives on: only a warning notice
// tells. Build the pool with [ConfigurePool], which marks the connection
// that gets that warning; the store clears the mark before each of its
// commits and reads it after, and answers a marked commit as one with no
// answer (the middleware's 503 with Retry-After; in lease mode the
// handler does not run). [Open] warns about a pool built without it.
//
// A serialization failure or deadlock (a default_transaction_isolation of
// repeatable read or serializable, which the store leaves to the
// application) rolls RunOnce's or Complete's transaction back: the error
// matches [idempotency.ErrUnavailable], and the middleware answers 503
// with Retry-After.
//
// fsync and full_page_writes cannot be set per transaction. [Open] (or
// [Store.Check] after [New]) looks at them once: fsync off is refused,
// full_page_writes off is a warning. A failover to an asynchronous
// standby loses the last commits, whatever the primary's settings: Open
// refuses a server that has standbys streaming from it and none
// synchronous, unless [Options.Replication] accepts the risk. It sees
// whether a standby is synchronous only with pg_monitor (or
// pg_read_all_stats), and warns without; it never sees cascaded or
// log-shipping standbys: declare them in [Options.Replication].
//
// A read that decides an answer checks pg_is_in_recovery() in its own
// transaction, which a pooler keeps on one server connection: RunOnce's
// look at the key (a miss runs the work; the check travels with the
// key's lock) and [Store.Get] (a miss is "nothing was done"). On a standby they fail with
// an error matching [idempotency.ErrUnavailable], and the middleware
// answers 503 with Retry-After; so does an insert refused as read-only.
// target_session_attrs is checked only when a connection opens, and a
// pooler moves server connections. A deposed primary that still runs is
// not in recovery: fencing it is the operator's job.
//
// # One clock
//
// Leases and retention are judged on the database's clock_timestamp(), read
// once per statement (not now(), which stands still inside a transaction),
// so every process on the database judges them alike whatever its host's
// clock says: a record is created at the database's now, its lease and
// expiry are as long as the middleware asks, and a takeover or a sweep
// happens when the database's clock says so. [Options.Clock] replaces that
// clock for tests, which move time without waiting; every store on the
// database must then share it.
//
// # One transaction
//
// With [idempotency.Config.OneTransaction], the middleware runs a fresh
// key's request through [Store.RunOnce]: one transaction holds the key's
// advisory lock (pg_try_advisory_xact_lock, taken without waiting, ended
// by the commit), the handler's writes through [Tx], and the COMPLETED
// record, which is inserted with the COMMIT in one round trip: one commit
// and one flush per fresh key, and no IN_PROGRESS row is ever committed.
// A duplicate in another process fails to take the lock, answers 409 and
// gives its connection back at once; [Store.Get] tries the same lock, so a
// lookup answers "in progress" while the work runs. A crash of the process
// or of the database before the commit leaves neither record nor effect;
// the retry does the work.
//
// # Every wait is bounded
//
// [Options.AcquireTimeout] (2 s) bounds the wait for the database's first
// answer: a connection from the pool and the first round trip on it,
// which behind PgBouncer includes the wait in its queue for a server
// connection. It bounds Insert, TakeOver, Release and Get whole, and the
// start of RunOnce and Complete. [Options.CommitTimeout] (10 s) bounds
// the commit's answer (RunOnce's last round trip, Complete's effect and
// commit) and every rollback. Past either bound the error matches
// context.DeadlineExceeded and the middleware answers 503 with
// Retry-After. A commit with no answer may have committed: its
// connection is closed, never given back to the pool, and the retry with
// the key finds what committed. So every call gives its connection back
// within its bounds, and closing the pool does not hang.
//
// Only RunOnce ends the transaction: the handler must neither commit it
// nor roll it back. Its Commit and Rollback fail, and a handler that calls
// either fails its request whatever it answers: the client gets 500 and
// nothing is stored. So does one that sends COMMIT or ROLLBACK as SQL
// through the transaction or its connection (the transaction carries a
// mark of its own, a transaction-local setting, which the record's insert
// checks): no answer is ever stored for an effect that did not commit with
// it. After a ROLLBACK nothing was done and the retry does the work
// cleanly; after a COMMIT sent as SQL, the effect written before it has
// committed on its own, without a record, outside the key's lock, and the
// retry does it again. Nested transactions (Begin, [pgx.BeginFunc]) are
// savepoints and may be committed and rolled back freely.
//
// The two modes share the table, so a key may meet a record of the other
// mode (a deploy that switched modes, or routes that share keys). A
// record of the lease mode IN_PROGRESS under a live lease answers 409 with
// Retry-After, and the work does not run. Once its lease has ended (its
// worker died, or gave the record up after a server error), RunOnce takes
// it over within its one transaction, for a request of the same content:
// it locks the row without waiting, the handler gets
// [idempotency.Info.Takeover] and the record's stable id, and the take-over,
// the effect and the COMPLETED record commit together. The old worker, if
// it still runs, then fails to complete (a lease-mode take-over). A
// request of other content gets 422.
//
// # Sweeping
//
// Both tables are swept in bounded batches, by the database's clock (or
// [Options.Clock]), and the two Sweep methods differ on purpose.
// [Store.Sweep](ctx, now) implements [idempotency.Store]: it deletes the
// records whose expiry, set from the middleware's retention, has passed by
// the store's clock; now is the caller's reading, which the interface
// carries and this store does not need. [Inbox.Sweep](ctx, olderThan)
// deletes the message ids processed more than olderThan ago, since an inbox
// row has no expiry of its own; pass the broker's redelivery window. Run
// either from one process or from all of them: a batch skips the rows
// another sweep holds.
//
// Times are stored as timestamptz, to the microsecond.
package pgstore
