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
			Anchor:  "AND ($4 = '' OR r.locked_until <= t.now) AND r.expires_at > t.now`,\n\t\tcaller(id), id.Key, from, to, s.now(), micros(until.Sub(now)))",
			Replace: "AND ($4 = '' OR r.locked_until <= $7) AND r.expires_at > t.now`,\n\t\tcaller(id), id.Key, from, to, s.now(), micros(until.Sub(now)), now)",
			Pkg:     "./idempotency/pgstore", Run: "^TestMiddlewareRunsOnceAcrossHostsWhoseClocksDisagree$", Env: pg,
		},
		{
			Name: "migrate-default-isolation", File: "idempotency/pgstore/migrate.go",
			Note:    "Migrate runs at the database's default isolation, whose snapshot predates the lock",
			Anchor:  "pgx.TxOptions{IsoLevel: pgx.ReadCommitted}",
			Replace: "pgx.TxOptions{}",
			Pkg:     "./idempotency/pgstore", Run: "^TestMigrateConcurrentlyUnderEveryDefaultIsolation$", Env: pg,
		},
		{
			Name: "async-insert-session-wide", File: "idempotency/pgstore/store.go",
			Note:    "AsyncInsert turns synchronous_commit off for the session, so Complete's commit is lost in a crash too",
			Anchor:  "set_config('synchronous_commit', 'off', true)",
			Replace: "set_config('synchronous_commit', 'off', false)",
			Pkg:     "./idempotency/pgstore", Run: "^TestAsyncInsertKeepsEveryCompletedRecordThroughACrash$", Env: pg,
		},
	})
}
