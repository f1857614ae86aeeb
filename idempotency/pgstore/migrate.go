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

func loadMigrations() ([]migration, error) { return readMigrations(migrations) }

// gooseUp opens every migration file: goose runs no file without it, and
// to PostgreSQL it is a comment.
const gooseUp = "-- +goose Up\n"

// readMigrations reads fsys's migrations/NNNN_name.sql files, in the order
// of their versions.
func readMigrations(fsys fs.FS) ([]migration, error) {
	files, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, f := range files {
		base := strings.TrimPrefix(f, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 || strings.HasSuffix(base, ".up.sql") || strings.HasSuffix(base, ".down.sql") {
			return nil, fmt.Errorf("pgstore: migration %s is not named NNNN_name.sql", f)
		}
		sql, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		if !strings.HasPrefix(string(sql), gooseUp) {
			return nil, fmt.Errorf("pgstore: migration %s does not open with %q", f, strings.TrimSpace(gooseUp))
		}
		out = append(out, migration{version: v, name: base, sql: string(sql)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("pgstore: migrations %s and %s have one version", out[i-1].name, out[i].name)
		}
	}
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
//
// Migrate refuses, changing nothing, a database that records a migration
// this version does not have (by version and file name): a database
// migrated by a newer version, or by a build from before the first
// release, whose schema this version cannot know.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	return migrate(ctx, pool, ms)
}

// migrate is Migrate with the migrations ms.
func migrate(ctx context.Context, pool *pgxpool.Pool, ms []migration) error {
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
		applied, err := appliedMigrations(ctx, tx, ms)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if applied[m.version] {
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

// appliedMigrations returns the versions of ms that the database records,
// or an error if it records one that ms does not hold.
func appliedMigrations(ctx context.Context, tx pgx.Tx, ms []migration) (map[int]bool, error) {
	known := make(map[int]string, len(ms))
	for _, m := range ms {
		known[m.version] = m.name
	}
	rows, err := tx.Query(ctx, "SELECT version, name FROM idempotency_schema_migrations ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("pgstore: migrate: read the applied versions: %w", err)
	}
	recorded, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (migration, error) {
		var m migration
		err := r.Scan(&m.version, &m.name)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: migrate: read the applied versions: %w", err)
	}
	applied := make(map[int]bool, len(recorded))
	for _, r := range recorded {
		if name, ok := known[r.version]; !ok || name != r.name {
			return nil, fmt.Errorf("pgstore: migrate: the database records migration %s (version %d), which this "+
				"version of pgstore does not have: a newer version, or a build from before the first release, "+
				"migrated it; nothing was changed (migrate with that version, or start from an empty database)",
				r.name, r.version)
		}
		applied[r.version] = true
	}
	return applied, nil
}
