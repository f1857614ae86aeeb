package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/long"
)

// TestPgBouncer: a client of the PgBouncer that PgBouncer starts reaches
// the database, and with one server connection (default_pool_size=1) in
// transaction pooling, a second client's query waits in PgBouncer's queue
// while the first holds a transaction open, and runs once it ends.
func TestPgBouncer(t *testing.T) {
	long.Skip(t, "starts PgBouncer")
	dsn := PgBouncer(t, DSN(t), PgBouncerOptions{PoolSize: 1})
	ctx := context.Background()
	connect := func() *pgx.Conn {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	first, second := connect(), connect()
	var db string
	if err := first.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db == "" {
		t.Fatalf("through PgBouncer: %q, %v", db, err)
	}
	tx, err := first.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// 200 ms in the queue: the query gets no server connection.
	qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = second.Exec(qctx, "SELECT 1")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a query while the only server connection is in a transaction: %v; want it to wait", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := connect().Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("once the transaction ended: %v", err)
	}
}
