package pgstore

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the store's own tests, on PostgreSQL, to kill the
// mutants of its rules.
func TestMutants(t *testing.T) {
	pg := []string{"IDEM_REQUIRE_POSTGRES=1"}
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "pg-lease-on-host-clock", File: "idempotency/pgstore/store.go",
			Note:    "a takeover is judged on the caller's clock, not the database's",
			Anchor:  "AND ($4 = '' OR r.locked_until <= t.now) AND NOT `+expiredSQL,\n\t\tcaller(id), id.Key, from, to, s.now(), micros(until.Sub(now)))",
			Replace: "AND ($4 = '' OR r.locked_until <= $7) AND NOT `+expiredSQL,\n\t\tcaller(id), id.Key, from, to, s.now(), micros(until.Sub(now)), now)",
			Pkg:     "./idempotency/pgstore", Run: "^TestMiddlewareRunsOnceAcrossHostsWhoseClocksDisagree$", Env: pg,
		},
		{
			Name: "pg-expires-under-live-lease", File: "idempotency/pgstore/store.go",
			Note:    "a record past its retention is replaced and swept under its worker's live lease",
			Anchor:  "`(r.expires_at <= t.now AND NOT (r.status = 'IN_PROGRESS' AND coalesce(r.locked_until > t.now, false)))`",
			Replace: "`(r.expires_at <= t.now)`",
			Pkg:     "./idempotency/pgstore", Run: "^TestStoreConformance$", Env: pg,
		},
		{
			Name: "pg-sweep-scans-the-table", File: "idempotency/pgstore/store.go",
			Note:    "the sweep's batch takes the store's now from a join and has no order: the planner reads the whole table when most records have expired",
			Anchor:  "SELECT r.ctid FROM idempotency_records r\n\t\tWHERE r.expires_at >= coalesce($2::timestamptz, '-infinity') AND ` + expiredNowSQL + `\n\t\tORDER BY r.expires_at\n",
			Replace: "SELECT r.ctid FROM idempotency_records r, t\n\t\tWHERE r.expires_at >= coalesce($2::timestamptz, '-infinity') AND ` + expiredSQL + `\n",
			Pkg:     "./idempotency/pgstore", Run: "^TestSweepWalksTheExpiresAtIndex$", Env: pg,
		},
		{
			Name: "pg-sweep-deletes-by-key", File: "idempotency/pgstore/store.go",
			Note:    "the sweep's DELETE finds its batch by key, not by ctid: the planner reads the table for it",
			Anchor:  "\tWHERE r.ctid = ANY (ARRAY(\n\t\tSELECT r.ctid FROM",
			Replace: "\tWHERE (r.caller, r.key) = ANY (ARRAY(\n\t\tSELECT (r.caller, r.key) FROM",
			Pkg:     "./idempotency/pgstore", Run: "^TestSweepWalksTheExpiresAtIndex$", Env: pg,
		},
		{
			Name: "pg-sweep-next-batch-after-ties", File: "idempotency/pgstore/store.go",
			Note:    "the next batch starts after the last batch's expiry, skipping the records that share it",
			Anchor:  "WHERE r.expires_at >= coalesce($2::timestamptz, '-infinity') AND",
			Replace: "WHERE r.expires_at > coalesce($2::timestamptz, '-infinity') AND",
			Pkg:     "./idempotency/pgstore", Run: "^TestSweepDeletesInBatches$", Env: pg,
		},
		{
			Name: "inbox-sweep-scans-the-table", File: "idempotency/pgstore/inbox.go",
			Note:    "the inbox sweep's batch has no order and no lower bound: the planner reads the whole inbox when most messages are old",
			Anchor:  "\t\tWHERE processed_at >= coalesce($2::timestamptz, '-infinity')\n\t\t\tAND processed_at < now() - $1::interval\n\t\tORDER BY processed_at\n",
			Replace: "\t\tWHERE processed_at < now() - $1::interval AND $2::timestamptz IS NOT DISTINCT FROM $2\n",
			Pkg:     "./idempotency/pgstore", Run: "^TestInboxSweepWalksTheProcessedAtIndex$", Env: pg,
		},
		{
			Name: "migrate-default-isolation", File: "idempotency/pgstore/migrate.go",
			Note:    "Migrate runs at the database's default isolation, whose snapshot predates the lock",
			Anchor:  "pgx.TxOptions{IsoLevel: pgx.ReadCommitted}",
			Replace: "pgx.TxOptions{}",
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrateConcurrentlyUnderEveryDefaultIsolation$", Env: pg,
		},
		{
			Name: "migrate-accepts-unknown-migrations", File: "idempotency/pgstore/migrate.go",
			Note:    "Migrate applies its migrations on a database that records migrations it does not have",
			Anchor:  "if name, ok := known[r.version]; !ok || name != r.name {",
			Replace: "if name, ok := known[r.version]; false && (!ok || name != r.name) {",
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrateRefusesUnknownMigrations$", Env: pg,
		},
		{
			Name: "migrate-knows-migrations-by-version-only", File: "idempotency/pgstore/migrate.go",
			Note:    "Migrate takes a recorded migration for its own when the version matches, whatever its name: an earlier build's 0001 passes",
			Anchor:  "if name, ok := known[r.version]; !ok || name != r.name {",
			Replace: "if _, ok := known[r.version]; !ok {",
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrateRefusesUnknownMigrations$", Env: pg,
		},
		{
			Name: "migrate-no-transaction-inside-the-transaction", File: "idempotency/pgstore/migrate.go",
			Note:    "a migration annotated NO TRANSACTION runs inside Migrate's transaction, where its COMMITs fail",
			Anchor:  "\t\t\tif m.noTx {\n",
			Replace: "\t\t\tif false {\n",
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrateRunsABatchedDataMigrationOutsideATransaction$", Env: pg,
		},
		{
			Name: "migrate-no-transaction-connection-back-to-pool", File: "idempotency/pgstore/migrate.go",
			Note:    "the connection of a migration outside a transaction goes back to the pool with the settings the migration made",
			Anchor:  "\tconn := pc.Hijack()\n\tdefer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()\n",
			Replace: "\tconn := pc.Conn()\n\tdefer pc.Release()\n",
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrateClosesTheConnectionOfAMigrationOutsideATransaction$", Env: pg,
		},
		{
			Name: "migrations-fs-without-up-suffix", File: "idempotency/pgstore/migrationsfs.go",
			Note:    "the files keep Migrate's names, which golang-migrate does not read",
			Anchor:  `name: strings.TrimSuffix(m.name, ".sql") + ".up.sql",`,
			Replace: `name: strings.TrimSuffix(m.name, ".up.sql"),`,
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrationsHoldsEveryMigrationInOrder$",
		},
		{
			Name: "migrations-fs-without-goose-annotation", File: "idempotency/pgstore/migrationsfs.go",
			Note:    "the files lack the annotation goose needs to run them",
			Anchor:  `data: []byte(m.sql),`,
			Replace: `data: []byte(strings.TrimPrefix(m.sql, gooseUp)),`,
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrationsHoldsEveryMigrationInOrder$",
		},
		{
			Name: "pg-caller-in-clear", File: "idempotency/pgstore/store.go",
			Note:    "the caller column holds the principal itself",
			Anchor:  "return idempotency.PrincipalDigest(id.Principal) }",
			Replace: "return id.Principal }",
			Pkg:     "./idempotency/pgstore", Run: "^TestCallerColumnNeverShowsTheCredential$", Env: pg,
		},
		{
			Name: "pg-replacement-keeps-old-fingerprint-version", File: "idempotency/pgstore/store.go",
			Note:    "a record that replaces an expired one keeps the expired one's fingerprint version",
			Anchor:  "fingerprint_version = $10, response_status = NULL",
			Replace: "response_status = NULL",
			Pkg:     "./idempotency/pgstore", Run: "^TestStoreConformance$/^default$/^ExpiryReplaces$", Env: pg,
		},
		{
			Name: "pg-once-lock-not-taken", File: "idempotency/pgstore/once.go",
			Note:    "RunOnce does not take the key's advisory lock: a duplicate runs the work beside the first",
			Anchor:  "b.Queue(`SELECT pg_try_advisory_xact_lock($1)`, lockKey(rec.ID))",
			Replace: "b.Queue(`SELECT $1::bigint IS NOT NULL`, lockKey(rec.ID))",
			Pkg:     "./idempotency/pgstore", Run: "^TestStoreConformance$/^default$/^RunOnceHoldsTheKey$", Env: pg,
		},
		{
			Name: "pg-lookup-ignores-lock", File: "idempotency/pgstore/store.go",
			Note:    "Get ignores the key's lock: a lookup finds nothing done while the work runs",
			Anchor:  "b.Queue(`SELECT pg_try_advisory_xact_lock_shared($1)`, lockKey(id))",
			Replace: "b.Queue(`SELECT $1::bigint IS NOT NULL`, lockKey(id))",
			Pkg:     "./idempotency/pgstore", Run: "^TestStoreConformance$/^default$/^RunOnceHoldsTheKey$", Env: pg,
		},
		{
			Name: "pg-once-commit-not-flushed", File: "idempotency/pgstore/once.go",
			Note:    "RunOnce's commit does not wait for the disk (synchronous_commit off)",
			Anchor:  "SELECT 1 / (SELECT count(*) FROM ins)::int`",
			Replace: "SELECT 1 / (SELECT count(*) FROM ins)::int FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async`",
			Pkg:     "./idempotency/pgstore", Run: "^TestOneTransactionSurvivesAPostgresCrash$", Env: pg,
		},
		{
			Name: "pg-once-ignores-lease-record", File: "idempotency/pgstore/once.go",
			Note:    "RunOnce commits its work though a lease-mode record of the key appeared",
			Anchor:  "SELECT 1 / (SELECT count(*) FROM ins)::int`",
			Replace: "SELECT 1`",
			Pkg:     "./idempotency/pgstore", Run: "^TestStoreConformance$/^default$/^RunOnceYieldsToALeaseRecord$", Env: pg,
		},
		{
			Name: "pg-once-effect-autocommitted", File: "idempotency/pgstore/once.go",
			Note:    "RunOnce opens no transaction: the effect commits on its own, before the record",
			Anchor:  `b.Queue("BEGIN")`,
			Replace: `b.Queue("SELECT 1")`,
			Pkg:     "./idempotency/pgstore", Run: "^TestOneTransactionAppKilledMidTransaction$", Env: pg,
		},
		{
			Name: "pg-once-effect-autocommitted-storm", File: "idempotency/pgstore/once.go",
			Note:    "as pg-once-effect-autocommitted, under a same-key storm over three processes",
			Anchor:  `b.Queue("BEGIN")`,
			Replace: `b.Queue("SELECT 1")`,
			Pkg:     "./idempotency/pgstore", Run: "^TestOneTransactionStormOverProcesses$", Env: pg,
		},
		{
			Name: "pg-once-handler-commit-stored", File: "idempotency/pgstore/once.go",
			Note:    "a handler that calls Commit or Rollback on the request's transaction, and answers 201, has its answer stored",
			Anchor:  "if tx.endTried {",
			Replace: "if false {",
			Pkg:     "./idempotency/pgstore", Run: "^TestOneTransactionHandlerThatEndsTheTransaction$/^(Commit|Rollback)$", Env: pg,
		},
		{
			Name: "pg-once-handler-sql-rollback-stored", File: "idempotency/pgstore/once.go",
			Note:    "a handler that sends ROLLBACK (or COMMIT) as SQL has its answer stored, in a transaction of its own, for an effect that rolled back",
			Anchor:  "WHERE current_setting('` + markSetting + `', true) = $11",
			Replace: "WHERE $11::text IS NOT NULL",
			Pkg:     "./idempotency/pgstore", Run: "^TestOneTransactionHandlerThatEndsTheTransaction$/^SQL", Env: pg,
		},
		{
			Name: "pg-once-leaves-ended-lease", File: "idempotency/pgstore/once.go",
			Note:    "RunOnce returns a lease-mode record whose lease ended instead of taking it over: the key answers 409 until the record expires",
			Anchor:  "if existing.Status != idempotency.StatusInProgress || existing.LockedUntil.After(now) ||",
			Replace: "if true ||",
			Pkg:     "./idempotency/pgstore", Run: "^(TestOneTransactionMeetsALeaseRecord|TestStoreConformance)$", Env: pg,
		},
		{
			Name: "pg-once-takeover-not-completed", File: "idempotency/pgstore/once.go",
			Note:    "RunOnce takes over an ended lease but its COMPLETED record may not replace it: the work rolls back, every time",
			Anchor:  "\t\tOR (r.status = 'IN_PROGRESS' AND r.owner = $12)\n",
			Replace: "\t\tOR $12::text = 'never'\n",
			Pkg:     "./idempotency/pgstore", Run: "^(TestOneTransactionMeetsALeaseRecord|TestStoreConformance)$", Env: pg,
		},
		{
			Name: "pg-once-takeover-unlocked", File: "idempotency/pgstore/once.go",
			Note:    "RunOnce takes over an ended lease without locking its row: the old worker completes it meanwhile, and the work rolls back",
			Anchor:  "\tFOR UPDATE OF r SKIP LOCKED)`",
			Replace: "\t)`",
			Pkg:     "./idempotency/pgstore", Run: "^TestRunOnceHoldsTheRecordItTakesOver$", Env: pg,
		},
		{
			Name: "once-lease-takeover-outside-the-transaction", File: "idempotency/middleware.go",
			Note:    "in the single-transaction mode, an ended lease of another fingerprint version is taken over as in the lease mode: the handler runs without its transaction, fails, and the key stays stuck",
			Anchor:  "\t\tif m.once != nil {\n\t\t\t// A lease-mode record whose lease ended",
			Replace: "\t\tif false {\n\t\t\t// A lease-mode record whose lease ended",
			Pkg:     "./idempotency/pgstore", Run: "^TestOneTransactionMeetsALeaseRecord$", Env: pg,
		},
		{
			Name: "pg-effect-tx-usable-after-complete", File: "idempotency/pgstore/store.go",
			Note:    "the transaction Complete gave the effect still works once the connection is back in the pool: an effect that kept it writes into the next user's transaction",
			Anchor:  "\t\tdefer etx.end() // before the connection goes back to the pool\n",
			Replace: "",
			Pkg:     "./idempotency/pgstore", Run: "^TestCompleteEffectTxRefusedAfterComplete$", Env: pg,
		},
		{
			Name: "pg-once-tx-usable-after-run", File: "idempotency/pgstore/once.go",
			Note:    "the transaction RunOnce gave the handler still works once the connection is back in the pool",
			Anchor:  "\tdefer tx.end() // before the connection goes back to the pool\n",
			Replace: "",
			Pkg:     "./idempotency/pgstore", Run: "^TestRunOnceTxRefusedAfterRunOnce$", Env: pg,
		},
		{
			Name: "pg-lease-effect-commit-stored", File: "idempotency/pgstore/store.go",
			Note:    "a lease-mode effect that calls Commit or Rollback on Complete's transaction, and returns nil, has its answer stored",
			Anchor:  "if etx.endTried {",
			Replace: "if false {",
			Pkg:     "./idempotency/pgstore", Run: "^TestLeaseEffectThatEndsTheTransaction$/^(Commit|Rollback)$", Env: pg,
		},
		{
			Name: "pg-lease-effect-sql-rollback-stored", File: "idempotency/pgstore/store.go",
			Note:    "a lease-mode effect that sends ROLLBACK (or COMMIT) as SQL has the COMPLETED record written outside any transaction, for an effect that rolled back",
			Anchor:  "AND current_setting('` + markSetting + `', true) = $7\n\tRETURNING 1)",
			Replace: "AND $7::text IS NOT NULL\n\tRETURNING 1)",
			Pkg:     "./idempotency/pgstore", Run: "^TestLeaseEffectThatEndsTheTransaction$/^SQL", Env: pg,
		},
		{
			Name: "once-no-flight", File: "idempotency/middleware.go",
			Note:    "a duplicate in the same process waits for a connection instead of answering 409",
			Anchor:  "\t\tif !owner {",
			Replace: "\t\tif !owner && false {",
			Pkg:     "./idempotency/pgstore", Run: "^TestOneTransactionDuplicateTakesNoConnection$", Env: pg,
		},
	})
}
