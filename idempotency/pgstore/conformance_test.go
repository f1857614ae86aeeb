package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency/storetest"
)

func TestStoreConformance(t *testing.T) {
	t.Run("default", func(t *testing.T) { conformance(t, nil) })
	// Pools that cannot keep prepared statements (behind PgBouncer in
	// transaction pooling, say) send parameters as text, or describe
	// each statement before it runs.
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			conformance(t, nil, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
		})
	}
}

// conformance runs the suite on one database, emptied before each check
// (the checks run one at a time): creating a database per check would
// cost more than the checks.
func conformance(t *testing.T, opts *Options, configure ...func(*pgxpool.Config)) {
	pool := newPool(t, configure...)
	if _, err := pool.Exec(context.Background(), "CREATE TABLE business_rows (name text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		if _, err := pool.Exec(context.Background(), "TRUNCATE idempotency_records, business_rows"); err != nil {
			t.Fatal(err)
		}
		clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		o := Options{}
		if opts != nil {
			o = *opts
		}
		o.Clock = clk
		return storetest.Subject{
			Store:  New(pool, &o),
			SetNow: func(t time.Time) { clk.Advance(t.Sub(clk.Now())) },
			WriteRow: func(ctx context.Context, name string) error {
				tx, ok := Tx(ctx)
				if !ok {
					return errors.New("the effect's context carries no transaction")
				}
				_, err := tx.Exec(ctx, "INSERT INTO business_rows (name) VALUES ($1)", name)
				return err
			},
			HasRow: func(ctx context.Context, name string) (bool, error) {
				var ok bool
				err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM business_rows WHERE name = $1)", name).Scan(&ok)
				return ok, err
			},
			AtRest: func(ctx context.Context) (string, error) {
				var rows string
				err := pool.QueryRow(ctx, "SELECT coalesce(string_agg(r::text, E'\n'), '') FROM idempotency_records r").Scan(&rows)
				return rows, err
			},
		}
	})
}
