package pgstore

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(envServe); dsn != "" {
		// The test binary started again as a server process of its own
		// (see startServer).
		os.Exit(serve(dsn))
	}
	os.Exit(pgtest.Main(m))
}

// newPool returns a pool on a new database with the schema applied. Each
// of configure, if any, changes the pool's configuration first.
func newPool(t *testing.T, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 30
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}
