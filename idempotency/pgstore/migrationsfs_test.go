package pgstore

import (
	"context"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtest"
)

// golangMigrateName is the file name golang-migrate's sources parse.
var golangMigrateName = regexp.MustCompile(`^([0-9]+)_(.*)\.(down|up)\.(.*)$`)

// TestMigrations checks the migrations' file system, read by other tools.
func TestMigrations(t *testing.T) {
	// The file system holds each embedded migration, in the order Migrate
	// applies them, with the names golang-migrate reads and the annotation
	// goose needs, and the same statements.
	t.Run("holds every migration in order", func(t *testing.T) {
		ms, err := loadMigrations()
		require.NoError(t, err)
		require.NotEmpty(t, ms)
		fsys := Migrations()

		entries, err := fs.ReadDir(fsys, ".")
		require.NoError(t, err)
		require.Len(t, entries, len(ms), "one file per migration")
		var names []string
		for i, e := range entries {
			m := ms[i]
			names = append(names, e.Name())
			assert.Equal(t, strings.TrimSuffix(m.name, ".sql")+".up.sql", e.Name(), "migration %d", i)
			match := golangMigrateName.FindStringSubmatch(e.Name())
			if assert.NotNil(t, match, "golang-migrate cannot parse %s", e.Name()) {
				assert.Equal(t, "up", match[3])
			}
			data, err := fs.ReadFile(fsys, e.Name())
			require.NoError(t, err)
			assert.True(t, strings.HasPrefix(string(data), "-- +goose Up\n"), "%s does not open with goose's annotation", e.Name())
			assert.Equal(t, m.sql, string(data), "%s holds other statements than Migrate applies", e.Name())
		}
		assert.IsIncreasing(t, names, "the files list in the order they apply")
		require.NoError(t, fstest.TestFS(fsys, names...))
	})

	// A database whose schema came from the files, run in their order as a
	// migration tool runs them, has the tables and indexes Migrate makes,
	// and the store works on it.
	t.Run("applied by another tool make the same schema", func(t *testing.T) {
		ctx := context.Background()
		byMigrate := newPool(t)

		byFiles, err := pgxpool.New(ctx, pgtest.DSN(t))
		require.NoError(t, err)
		t.Cleanup(byFiles.Close)
		entries, err := fs.ReadDir(Migrations(), ".")
		require.NoError(t, err)
		for _, e := range entries {
			sql, err := fs.ReadFile(Migrations(), e.Name())
			require.NoError(t, err)
			_, err = byFiles.Exec(ctx, string(sql))
			require.NoError(t, err, "apply %s", e.Name())
		}

		assert.Equal(t, schemaOf(t, byMigrate), schemaOf(t, byFiles))

		s := New(byFiles, nil)
		rec := inProgress("k", "w1", t0)
		_, inserted, err := s.Insert(ctx, rec)
		require.NoError(t, err)
		assert.True(t, inserted)
	})
}

// schemaOf lists the columns and indexes of idem's tables, leaving out
// Migrate's own bookkeeping table.
func schemaOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns
		WHERE table_schema = 'public' AND table_name <> 'idempotency_schema_migrations'
		UNION ALL
		SELECT indexdef FROM pg_indexes
		WHERE schemaname = 'public' AND tablename <> 'idempotency_schema_migrations'
		ORDER BY 1`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, out)
	return out
}
