package contractcheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/cmd/idemcheck/internal/contractcheck"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestRunFakeServerOnPostgres: with its state in PostgreSQL the fake server
// keeps the whole contract too; every row passes, the dead worker's row
// waited out on the server's manual clock.
func TestRunFakeServerOnPostgres(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), pgtest.DSN(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, fakeserver.Migrate(context.Background(), pool))

	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk, Postgres: pool})
	rep, err := contractcheck.Run(context.Background(), contractcheck.Config{
		URL:    srv.URL + "/payments",
		Auth:   "Bearer caller-1",
		Auth2:  "Bearer caller-2",
		Lookup: srv.URL + "/payments?idempotency_key={key}",
		Sleep:  clk.Sleep,
	}, nil)
	require.NoError(t, err)
	require.Len(t, rep.Rows, len(contractcheck.Rows()))
	for _, r := range rep.Rows {
		assert.Equal(t, contractcheck.Pass, r.Status, "%s: %s %v", r.ID, r.Detail, r.Evidence)
	}
	assert.True(t, rep.OK())
}
