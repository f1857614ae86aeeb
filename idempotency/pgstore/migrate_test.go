package pgstore

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestMigrateRefusesUnknownMigrations: a database that records a
// migration this version does not have is refused with an error that
// names it, and Migrate changes nothing.
func TestMigrateRefusesUnknownMigrations(t *testing.T) {
	ctx := context.Background()
	recorded := func(t *testing.T, pool *pgxpool.Pool) []string {
		t.Helper()
		rows, err := pool.Query(ctx, "SELECT name FROM idempotency_schema_migrations ORDER BY version")
		require.NoError(t, err)
		var names []string
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			names = append(names, n)
		}
		require.NoError(t, rows.Err())
		return names
	}

	t.Run("a database from a build before the first release", func(t *testing.T) {
		pool, err := pgxpool.New(ctx, pgtest.DSN(t))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		// What the earlier builds recorded: their own 0001, 0002 and 0004,
		// with the records table of 0001.
		_, err = pool.Exec(ctx, `CREATE TABLE idempotency_schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO idempotency_schema_migrations (version, name) VALUES
			(1, '0001_records.sql'), (2, '0002_inbox.sql'), (4, '0004_caller_digest_fingerprint_version.sql');
		CREATE TABLE idempotency_records (caller text, key text, PRIMARY KEY (caller, key))`)
		require.NoError(t, err)

		err = Migrate(ctx, pool)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "0001_records.sql (version 1)")
		assert.Contains(t, err.Error(), "does not have")
		assert.Contains(t, err.Error(), "nothing was changed")
		assert.Equal(t, []string{"0001_records.sql", "0002_inbox.sql", "0004_caller_digest_fingerprint_version.sql"}, recorded(t, pool))
		var inbox bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('idempotency_inbox') IS NOT NULL").Scan(&inbox))
		assert.False(t, inbox, "Migrate created a table in a database it refused")
	})

	t.Run("a database a newer version migrated", func(t *testing.T) {
		pool := newPool(t)
		before := recorded(t, pool)
		_, err := pool.Exec(ctx, "INSERT INTO idempotency_schema_migrations (version, name) VALUES (9999, '9999_from_the_future.sql')")
		require.NoError(t, err)

		err = Migrate(ctx, pool)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "9999_from_the_future.sql (version 9999)")
		assert.Equal(t, append(before, "9999_from_the_future.sql"), recorded(t, pool))
	})

	t.Run("a database this version migrated is migrated again", func(t *testing.T) {
		pool := newPool(t)
		before := recorded(t, pool)
		require.NoError(t, Migrate(ctx, pool))
		assert.Equal(t, before, recorded(t, pool))
	})
}
