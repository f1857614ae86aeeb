package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migration is one versioned schema change, migrations/NNNN_name.sql.
type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations() ([]migration, error) {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, f := range files {
		base := strings.TrimPrefix(f, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("pgstore: migration %s is not named NNNN_name.sql", f)
		}
		sql, err := migrations.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: base, sql: string(sql)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// migrateLock is the advisory lock that serialises Migrate across
// processes (an arbitrary constant: "idem" in ASCII).
const migrateLock = 0x6964656d

// Migrate brings the schema up to date: it applies, in order, each embedded
// migration not yet recorded in the table idempotency_schema_migrations, all
// in one transaction, so that a failed migration leaves the schema as it
// was. It is safe to call on every start, from several processes at once:
// an advisory lock makes them take turns, and a migration already applied
// is skipped. The transaction is READ COMMITTED whatever the database's
// default_transaction_isolation: under REPEATABLE READ or SERIALIZABLE its
// snapshot would be taken before the lock is held, and it would not see the
// migrations that the process holding the lock before it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLock); err != nil {
			return fmt.Errorf("pgstore: migrate: take the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS idempotency_schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return fmt.Errorf("pgstore: migrate: create the migrations table: %w", err)
		}
		for _, m := range ms {
			var done bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM idempotency_schema_migrations WHERE version = $1)",
				m.version).Scan(&done); err != nil {
				return fmt.Errorf("pgstore: migrate: read the applied versions: %w", err)
			}
			if done {
				continue
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("pgstore: migrate: apply %s: %w", m.name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO idempotency_schema_migrations (version, name) VALUES ($1, $2)",
				m.version, m.name); err != nil {
				return fmt.Errorf("pgstore: migrate: record %s: %w", m.name, err)
			}
		}
		return nil
	})
}
