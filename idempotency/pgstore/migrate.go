package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
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
	// noTx marks a migration annotated "-- +goose NO TRANSACTION". It is
	// a data migration that commits between batches. It runs outside any
	// transaction, one statement at a time.
	noTx bool
	// statements are the file's statements as goose splits them.
	statements []string
}

func loadMigrations() ([]migration, error) { return readMigrations(migrations) }

// gooseUp opens every migration file. goose runs no file without it, and
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
		stmts, noTx, err := gooseStatements(string(sql))
		if err != nil {
			return nil, fmt.Errorf("pgstore: migration %s: %w", f, err)
		}
		out = append(out, migration{version: v, name: base, sql: string(sql), noTx: noTx, statements: stmts})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("pgstore: migrations %s and %s have one version", out[i-1].name, out[i].name)
		}
	}
	return out, nil
}

// gooseStatements splits a migration file into statements as goose does. A
// statement ends with the line whose last word before any "--" ends with
// a semicolon. The annotations "-- +goose StatementBegin" and "-- +goose
// StatementEnd" enclose one statement, such as a PL/pgSQL body with
// semicolons of its own. noTx says whether the file is annotated "-- +goose
// NO TRANSACTION". Comment lines before a statement are left out.
func gooseStatements(sql string) (stmts []string, noTx bool, err error) {
	var (
		buf   strings.Builder
		block bool // between StatementBegin and StatementEnd
	)
	for line := range strings.Lines(sql) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") && strings.Contains(trimmed, "+goose") {
			switch annotation := strings.TrimSpace(strings.Replace(strings.TrimPrefix(trimmed, "--"), "+goose", "", 1)); {
			case strings.EqualFold(annotation, "Up"):
			case strings.EqualFold(annotation, "NO TRANSACTION"):
				noTx = true
			case strings.EqualFold(annotation, "StatementBegin") && !block && strings.TrimSpace(buf.String()) == "":
				block = true
			case strings.EqualFold(annotation, "StatementEnd") && block:
				block = false
				stmts = append(stmts, strings.TrimSpace(buf.String()))
				buf.Reset()
			default:
				return nil, false, fmt.Errorf("annotation %q is not one pgstore's migrations use, or is out of place", trimmed)
			}
			continue
		}
		if buf.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")) {
			continue
		}
		buf.WriteString(line)
		if !block && endsStatement(line) {
			stmt := strings.TrimSpace(buf.String())
			if dollarQuote.MatchString(stmt) {
				// goose would cut the body at its first semicolon.
				return nil, false, fmt.Errorf("a dollar-quoted body (PL/pgSQL) outside -- +goose StatementBegin and StatementEnd: %.40q", stmt)
			}
			stmts = append(stmts, stmt)
			buf.Reset()
		}
	}
	if block {
		return nil, false, errors.New("-- +goose StatementBegin without its StatementEnd")
	}
	if rest := strings.TrimSpace(buf.String()); rest != "" {
		return nil, false, fmt.Errorf("a statement does not end with a semicolon at the end of its line: %.40q", rest)
	}
	return stmts, noTx, nil
}

// dollarQuote matches the opening of a dollar-quoted string: $$ or $tag$.
var dollarQuote = regexp.MustCompile(`\$[A-Za-z_]*\$`)

// endsStatement says whether line's last word before any "--" ends with a
// semicolon, as goose decides where a statement ends.
func endsStatement(line string) bool {
	last := ""
	for word := range strings.FieldsSeq(line) {
		if strings.HasPrefix(word, "--") {
			break
		}
		last = word
	}
	return strings.HasSuffix(last, ";")
}

// migrateLock is the advisory lock that serialises Migrate across
// processes. It is an arbitrary constant: "idem" in ASCII.
const migrateLock = 0x6964656d

// Migrate brings the schema up to date. It applies each embedded migration
// not yet recorded in idempotency_schema_migrations, in order. They run in
// one transaction, so a failed migration leaves the schema as it was. It
// is safe to call on every start, from several processes at once. An
// advisory lock makes them take turns, and an applied migration is
// skipped. The transaction is READ COMMITTED, whatever the database's
// default. A stricter level would take its snapshot before the lock. It
// would then miss what the lock's last holder applied.
//
// A migration annotated "-- +goose NO TRANSACTION" runs as goose runs it.
// It runs after the migrations before it have committed, a statement at a
// time. It runs on a connection of its own, closed afterwards, so that
// its settings end with it. It is recorded once it has run. Such a
// migration is written to be run again; see "Migrations" in
// docs/SERVER.md.
//
// Migrate refuses a database that records a migration this version does
// not have. It changes nothing there. A newer version, or a build from
// before the first release, may have made such a database.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	return migrate(ctx, pool, ms)
}

// readCommitted is the isolation of Migrate's transactions (see Migrate).
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// migrate is Migrate with the migrations ms.
func migrate(ctx context.Context, pool *pgxpool.Pool, ms []migration) error {
	for {
		next, err := migrateInTx(ctx, pool, ms)
		if err != nil || next == nil {
			return err
		}
		if err := migrateOutsideTx(ctx, pool, ms, *next); err != nil {
			return err
		}
	}
}

// migrateInTx applies the migrations of ms not yet recorded, in one
// transaction. It stops at the first that must run outside a transaction,
// and returns that one. It returns nil when none is left.
func migrateInTx(ctx context.Context, pool *pgxpool.Pool, ms []migration) (next *migration, err error) {
	err = pgx.BeginTxFunc(ctx, pool, readCommitted, func(tx pgx.Tx) error {
		applied, err := lockMigrations(ctx, tx, ms)
		if err != nil {
			return err
		}
		for i, m := range ms {
			if applied[m.version] {
				continue
			}
			if m.noTx {
				next = &ms[i]
				return nil
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("pgstore: migrate: apply %s: %w", m.name, err)
			}
			if err := recordMigration(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	})
	return next, err
}

// migrateOutsideTx runs m, one of ms, a statement at a time outside any
// transaction. It then records m, unless another process has.
func migrateOutsideTx(ctx context.Context, pool *pgxpool.Pool, ms []migration, m migration) error {
	if err := runOutsideTx(ctx, pool, m); err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, pool, readCommitted, func(tx pgx.Tx) error {
		applied, err := lockMigrations(ctx, tx, ms)
		if err != nil || applied[m.version] {
			return err
		}
		return recordMigration(ctx, tx, m)
	})
}

// runOutsideTx runs m's statements one at a time on a connection of its
// own, outside any transaction.
func runOutsideTx(ctx context.Context, pool *pgxpool.Pool, m migration) error {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: apply %s: acquire a connection: %w", m.name, err)
	}
	// The pool forgets the connection. It is closed with whatever session
	// settings the migration made.
	conn := pc.Hijack()
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	for i, stmt := range m.statements {
		// Without arguments pgx sends the simple protocol. The statement
		// runs outside any transaction block, so a DO block may COMMIT.
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("pgstore: migrate: apply %s, outside a transaction (statement %d of %d; what ran before it stays): %w",
				m.name, i+1, len(m.statements), err)
		}
	}
	return nil
}

// lockMigrations takes the migration lock for tx's transaction. It creates
// the migrations table if there is none. It returns the versions of ms
// that the database records. It fails if the database records one that ms
// does not hold.
func lockMigrations(ctx context.Context, tx pgx.Tx, ms []migration) (map[int]bool, error) {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLock); err != nil {
		return nil, fmt.Errorf("pgstore: migrate: take the migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS idempotency_schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return nil, fmt.Errorf("pgstore: migrate: create the migrations table: %w", err)
	}
	return appliedMigrations(ctx, tx, ms)
}

func recordMigration(ctx context.Context, tx pgx.Tx, m migration) error {
	if _, err := tx.Exec(ctx, "INSERT INTO idempotency_schema_migrations (version, name) VALUES ($1, $2)",
		m.version, m.name); err != nil {
		return fmt.Errorf("pgstore: migrate: record %s: %w", m.name, err)
	}
	return nil
}

// appliedMigrations returns the versions of ms that the database records.
// It fails if the database records one that ms does not hold.
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
				"version of pgstore does not have: a newer version, or another program, "+
				"migrated it; nothing was changed (migrate with that version, or start from an empty database)",
				r.name, r.version)
		}
		applied[r.version] = true
	}
	return applied, nil
}
