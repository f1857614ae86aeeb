package fakeserver_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestALongCredentialPays: a 3,000-character token, and one near the
// program's 16 KiB header limit, pay (201) and replay, in memory and on
// PostgreSQL, where the caller is kept as a digest that fits the index.
func TestALongCredentialPays(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"memory", "postgres"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			opts := &fakeserver.Options{}
			if where == "postgres" {
				opts.Postgres = newPool(t)
			}
			s, _ := newServer(t, opts)
			for i, n := range []int{3000, 15 << 10} {
				auth := "Bearer sk_live_" + storetest.RandomToken(n)
				key := []string{"k-3000", "k-15k"}[i]
				first := send(t, s.Client(), s.URL, req{Key: key, Auth: auth, Body: payBody})
				require.Equal(t, http.StatusCreated, first.Status, "%d characters: %s", n, first.Body)
				again := send(t, s.Client(), s.URL, req{Key: key, Auth: auth, Body: payBody})
				assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
				assert.Equal(t, http.StatusOK, send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=" + key, Auth: auth, NoKey: true}).Status)
			}
			assert.Equal(t, 2, s.Stats().ProviderCharges)
		})
	}
}

// TestTablesNeverShowTheCredential: on PostgreSQL the records', payments'
// and orders' callers are digests, never the Authorization value.
func TestTablesNeverShowTheCredential(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s, _ := newServer(t, &fakeserver.Options{Postgres: pool})
	const secret = "sk_live_51HzQ2eLkdIwHu7ix0Ff3"
	require.Equal(t, http.StatusCreated, send(t, s.Client(), s.URL, req{Key: "k1", Auth: "Bearer " + secret, Body: payBody}).Status)
	require.Equal(t, http.StatusOK, send(t, s.Client(), s.URL, req{Method: http.MethodPut, Path: "/orders/o1/status", Auth: "Bearer " + secret, NoKey: true, Body: `{"status":"SHIPPED"}`}).Status)
	for _, q := range []string{"SELECT caller FROM idempotency_records", "SELECT principal FROM fake_payments", "SELECT principal FROM fake_orders"} {
		rows, err := pool.Query(context.Background(), q)
		require.NoError(t, err)
		callers, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		assert.Equal(t, []string{idempotency.PrincipalDigest("Bearer " + secret)}, callers, q)
	}
}

// TestMigrateDigestsExistingPayments: payments and orders written with the
// caller in clear are rewritten once by Migrate, and stay the caller's.
func TestMigrateDigestsExistingPayments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	const auth = "Bearer sk_live_old"
	// The tables as a fake server before the digest left them.
	_, err := pool.Exec(ctx, `DELETE FROM fake_migrations WHERE name = 'principal-digest';
		INSERT INTO fake_payments (id, principal, idem_key, amount, currency, customer, description, status, created_at)
		VALUES ('pay_old', 'Bearer sk_live_old', 'k-old', 1500, 'AZN', 'cus_1', '', 'succeeded', now());
		INSERT INTO fake_orders (principal, id, status) VALUES ('Bearer sk_live_old', 'o1', 'SHIPPED')`)
	require.NoError(t, err)
	require.NoError(t, fakeserver.Migrate(ctx, pool))
	require.NoError(t, fakeserver.Migrate(ctx, pool), "once only: a second start changes nothing")

	var payments, orders string
	require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT principal FROM fake_payments), (SELECT principal FROM fake_orders)").Scan(&payments, &orders))
	assert.Equal(t, idempotency.PrincipalDigest(auth), payments)
	assert.Equal(t, idempotency.PrincipalDigest(auth), orders)
	s, _ := newServer(t, &fakeserver.Options{Postgres: pool})
	assert.Equal(t, http.StatusOK, send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments/pay_old", Auth: auth, NoKey: true}).Status)
	assert.Equal(t, http.StatusOK, send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=k-old", Auth: auth, NoKey: true}).Status)
}

// TestMigrateConcurrentlyUnderEveryDefaultIsolation: three processes that
// start together on a database whose default isolation is any of
// PostgreSQL's each migrate without error, and the fake server's tables are
// there once.
func TestMigrateConcurrentlyUnderEveryDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			dsn := pgtest.DSN(t)
			ctx := context.Background()
			admin, err := pgx.Connect(ctx, dsn)
			require.NoError(t, err)
			defer admin.Close(ctx)
			_, err = admin.Exec(ctx, "ALTER DATABASE "+admin.Config().Database+" SET default_transaction_isolation = '"+level+"'")
			require.NoError(t, err)
			var wg sync.WaitGroup
			for range 3 {
				// One pool per process, whose connections take the
				// database's default isolation.
				pool, err := pgxpool.New(ctx, dsn)
				require.NoError(t, err)
				defer pool.Close()
				wg.Go(func() { assert.NoError(t, fakeserver.Migrate(ctx, pool)) })
			}
			wg.Wait()
			var tables int
			require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables
				WHERE tablename IN ('fake_payments', 'fake_intents', 'fake_charges')`).Scan(&tables))
			assert.Equal(t, 3, tables)
		})
	}
}
