package migrationtest

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx" driver, which both tools take
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/pgstore"
	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestMigrationsAppliedByTheTools: goose and golang-migrate each apply
// pgstore.Migrations() as it is, to an empty database, and again as a
// no-op; the schema is the one pgstore.Migrate makes, and the store and
// the inbox work on it.
func TestMigrationsAppliedByTheTools(t *testing.T) {
	ctx := context.Background()
	files, err := fs.ReadDir(pgstore.Migrations(), ".")
	require.NoError(t, err)
	require.NotEmpty(t, files)

	byMigrate := pool(t, pgtest.DSN(t))
	require.NoError(t, pgstore.Migrate(ctx, byMigrate))
	want := schemaOf(t, byMigrate)

	t.Run("goose", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		db := sqlDB(t, dsn)
		p, err := goose.NewProvider(goose.DialectPostgres, db, pgstore.Migrations())
		require.NoError(t, err)
		results, err := p.Up(ctx)
		require.NoError(t, err, "goose up")
		require.Len(t, results, len(files), "goose applies one migration per file")
		for i, r := range results {
			assert.NoError(t, r.Error, "goose applying %s", files[i].Name())
		}
		again, err := p.Up(ctx)
		require.NoError(t, err, "goose up on a migrated database")
		assert.Empty(t, again, "goose up on a migrated database applies nothing")
		version, err := p.GetDBVersion(ctx)
		require.NoError(t, err)
		assert.Equal(t, lastVersion(t, files), version)

		pool := pool(t, dsn)
		assert.Equal(t, want, schemaOf(t, pool), "goose made another schema than pgstore.Migrate")
		smoke(t, pool)
	})

	t.Run("golang-migrate", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		src, err := iofs.New(pgstore.Migrations(), ".")
		require.NoError(t, err)
		driver, err := migratepgx.WithInstance(sqlDB(t, dsn), &migratepgx.Config{})
		require.NoError(t, err)
		m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
		require.NoError(t, err)
		require.NoError(t, m.Up(), "golang-migrate up")
		assert.ErrorIs(t, m.Up(), migrate.ErrNoChange, "golang-migrate up on a migrated database")
		version, dirty, err := m.Version()
		require.NoError(t, err)
		assert.False(t, dirty)
		assert.Equal(t, lastVersion(t, files), int64(version))

		pool := pool(t, dsn)
		assert.Equal(t, want, schemaOf(t, pool), "golang-migrate made another schema than pgstore.Migrate")
		smoke(t, pool)
	})
}

// lastVersion is the version of the last migration file.
func lastVersion(t *testing.T, files []fs.DirEntry) int64 {
	t.Helper()
	v, err := goose.NumericComponent(files[len(files)-1].Name())
	require.NoError(t, err)
	return v
}

// smoke writes a record through pgstore, completes it with its answer and
// reads it back, and processes an inbox message once.
func smoke(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	s := pgstore.New(pool, nil)
	now := time.Now()
	id := idempotency.ID{Principal: "acct_1", Key: "k1"}
	rec := &idempotency.Record{ID: id, Status: idempotency.StatusInProgress, StableID: "st_1", Owner: "w1",
		LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour), FingerprintVersion: 1}
	rec.Fingerprint[0] = 7
	_, inserted, err := s.Insert(ctx, rec)
	require.NoError(t, err)
	require.True(t, inserted)
	wrote := false
	require.NoError(t, s.Complete(ctx, id, "w1", &idempotency.Response{StatusCode: 201, Body: []byte("paid")},
		func(ctx context.Context) error {
			_, ok := pgstore.Tx(ctx)
			wrote = ok
			return nil
		}))
	assert.True(t, wrote, "the effect ran in the store's transaction")
	got, found, err := s.Get(ctx, id, now)
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, idempotency.StatusCompleted, got.Status)
	assert.Equal(t, 1, got.FingerprintVersion)
	assert.Equal(t, "paid", string(got.Response.Body))

	in := pgstore.NewInbox(pool)
	for i, want := range []bool{true, false} {
		did, err := in.Process(ctx, "queue", "m1", func(context.Context, pgx.Tx) error { return nil })
		require.NoError(t, err)
		assert.Equal(t, want, did, "delivery %d", i+1)
	}
}

func pool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func sqlDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// schemaOf lists the columns, indexes and constraints of idem's tables,
// leaving out each tool's own bookkeeping table.
func schemaOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns
		WHERE table_schema = 'public' AND table_name LIKE 'idempotency\_%' AND table_name <> 'idempotency_schema_migrations'
		UNION ALL
		SELECT indexdef FROM pg_indexes
		WHERE schemaname = 'public' AND tablename LIKE 'idempotency\_%' AND tablename <> 'idempotency_schema_migrations'
		UNION ALL
		SELECT conrelid::regclass || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
		WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text LIKE 'idempotency\_%'
			AND conrelid::regclass::text <> 'idempotency_schema_migrations'
		UNION ALL
		SELECT 'comment ' || c.relname || '.' || a.attname || ' ' || d.description
		FROM pg_description d JOIN pg_class c ON c.oid = d.objoid
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.objsubid
		WHERE c.relname LIKE 'idempotency\_%'
		ORDER BY 1`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, out)
	return out
}

// TestExampleMigrationsAppliedByTheTools: the example migrations of
// docs/SERVER.md ("Rules for later migrations"), a column and a data
// migration that commits between batches, given to the tools after
// pgstore.Migrations() on a table that holds records: goose runs both,
// and golang-migrate runs the column but not the data migration, which it
// sends as one query, as the docs say.
func TestExampleMigrationsAppliedByTheTools(t *testing.T) {
	ctx := context.Background()
	fsys := withExamples(t)
	const records = 12_000

	t.Run("goose runs both", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		p, err := goose.NewProvider(goose.DialectPostgres, sqlDB(t, dsn), fsys)
		require.NoError(t, err)
		_, err = p.UpTo(ctx, 1)
		require.NoError(t, err)
		pool := pool(t, dsn)
		fill(t, pool, records)
		_, err = p.Up(ctx)
		require.NoError(t, err, "goose up with the examples")
		var filled int
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT count(*) FROM idempotency_records WHERE response_size = octet_length(response_body)").Scan(&filled))
		assert.Equal(t, records, filled)
	})

	t.Run("golang-migrate runs the column only", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		src, err := iofs.New(fsys, ".")
		require.NoError(t, err)
		driver, err := migratepgx.WithInstance(sqlDB(t, dsn), &migratepgx.Config{})
		require.NoError(t, err)
		m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
		require.NoError(t, err)
		require.NoError(t, m.Migrate(1))
		fill(t, pool(t, dsn), records)
		require.NoError(t, m.Migrate(2), "golang-migrate runs the column's migration")
		err = m.Up()
		require.ErrorContains(t, err, "invalid transaction termination",
			"golang-migrate ran a data migration that commits between batches")
	})
}

// withExamples is pgstore.Migrations() with the example migrations of
// docs/SERVER.md after them, named as the tools read them: each is the
// sql block after a line "<!-- example migration: NAME -->".
func withExamples(t *testing.T) fs.FS {
	t.Helper()
	fsys := fstest.MapFS{}
	files, err := fs.ReadDir(pgstore.Migrations(), ".")
	require.NoError(t, err)
	for _, f := range files {
		data, err := fs.ReadFile(pgstore.Migrations(), f.Name())
		require.NoError(t, err)
		fsys[f.Name()] = &fstest.MapFile{Data: data}
	}
	doc, err := os.ReadFile("../../../docs/SERVER.md")
	require.NoError(t, err)
	const marker = "<!-- example migration: "
	rest, examples := string(doc), 0
	for {
		_, after, ok := strings.Cut(rest, marker)
		if !ok {
			break
		}
		name, after, _ := strings.Cut(after, " -->\n```sql\n")
		body, after, ok := strings.Cut(after, "```\n")
		require.True(t, ok, "the example %s has no end", name)
		fsys[strings.TrimSuffix(name, ".sql")+".up.sql"] = &fstest.MapFile{Data: []byte(body)}
		rest = after
		examples++
	}
	require.Equal(t, 2, examples, "docs/SERVER.md's example migrations")
	return fsys
}

// fill inserts n completed records with bodies, with one INSERT.
func fill(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO idempotency_records
		(caller, key, fingerprint, fingerprint_version, status, stable_id, created_at, expires_at,
		 response_status, response_header, response_body)
		SELECT encode(sha256(int8send(i % 100)), 'hex'), 'key-' || i, sha256(int8send(i)), 2, 'COMPLETED', 'st_' || i,
			now(), now() + interval '1 day', 201, '{}', convert_to(repeat('x', i % 300), 'UTF8')
		FROM generate_series(1, $1) AS i`, n)
	require.NoError(t, err)
}
