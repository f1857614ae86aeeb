package pgfake_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/pgfake"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/pgtest"
)

// The fake server's own tests run whole on PostgreSQL with
// IDEM_FAKESERVER_POSTGRES=1; these are the tests of what only PostgreSQL
// has: the tables, the migration, and the end of New's context.

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const payBody = `{"amount":1500,"currency":"AZN","customer":"cus_1","description":"coffee"}`

// newPool returns a pool on a new database with the fake server's schema.
func newPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.DSN(tb))
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	require.NoError(tb, pgfake.Migrate(context.Background(), pool))
	return pool
}

// start starts a server that is closed when tb and its subtests are done.
func start(tb testing.TB, opts *fakeserver.Options) *fakeserver.Server {
	tb.Helper()
	s := fakeserver.NewServer(opts)
	tb.Cleanup(s.Close)
	return s
}

// req describes one request.
type req struct {
	Method, Path, Key, Auth, Body string
	NoKey                         bool
}

type answer struct {
	Status int
	Body   []byte
}

func trySend(c *http.Client, base string, r req) (answer, error) {
	if r.Method == "" {
		r.Method = http.MethodPost
	}
	if r.Path == "" {
		r.Path = "/payments"
	}
	hr, err := http.NewRequest(r.Method, base+r.Path, strings.NewReader(r.Body))
	if err != nil {
		return answer{}, err
	}
	if !r.NoKey {
		hr.Header.Set("Idempotency-Key", r.Key)
	}
	if r.Auth != "" {
		hr.Header.Set("Authorization", r.Auth)
	}
	resp, err := c.Do(hr)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{Status: resp.StatusCode, Body: body}, err
}

func send(tb testing.TB, c *http.Client, base string, r req) answer {
	tb.Helper()
	a, err := trySend(c, base, r)
	require.NoError(tb, err)
	return a
}

// TestNew checks the fake server's state on PostgreSQL as New makes it.
func TestNew(t *testing.T) {
	// A payment's commit waits on a lock another session holds; cancelling
	// the context given to New ends it at once, and once the lock is gone
	// nothing of it commits: the record stays IN_PROGRESS for a resend to
	// take over.
	t.Run("its context ends a commit waiting on a lock", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t)
		life, abort := context.WithCancel(context.Background())
		defer abort()
		var logs syncBuffer
		s := start(t, &fakeserver.Options{Storage: pgfake.New(life, pool),
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "LOCK TABLE fake_payments IN EXCLUSIVE MODE")
		require.NoError(t, err)

		answered := make(chan int, 1)
		go func() {
			a, err := trySend(s.Client(), s.URL, req{Key: "locked", Body: payBody})
			if err != nil {
				answered <- 0
				return
			}
			answered <- a.Status
		}()
		conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
		require.NoError(t, err)
		defer conn.Close(ctx)
		require.Eventually(t, func() bool {
			var waiting int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO fake_payments%'`).Scan(&waiting)
			return err == nil && waiting == 1
		}, time.Minute, 10*time.Millisecond, "the commit never waited on the lock")

		abort()
		select {
		case code := <-answered:
			assert.GreaterOrEqual(t, code, http.StatusInternalServerError, "the aborted request is a server error")
		case <-time.After(20 * time.Second):
			t.Fatal("the request still waits on the lock 20 s after the context ended")
		}
		require.NoError(t, tx.Rollback(ctx))
		var payments, inProgress int
		require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM fake_payments),
		(SELECT count(*) FROM idempotency_records WHERE status = 'IN_PROGRESS')`).Scan(&payments, &inProgress))
		assert.Zero(t, payments, "the aborted payment committed")
		assert.Equal(t, 1, inProgress)
		// The store's own bound on a commit (pgstore's CommitTimeout, 10 s)
		// would end the wait too, later: the error says which ended it.
		assert.Contains(t, logs.String(), "context canceled", "ended by the context given to New")
		assert.NotContains(t, logs.String(), "deadline exceeded")
	})

	// On PostgreSQL the records', payments' and orders' callers are digests,
	// never the Authorization value.
	t.Run("the tables never show the credential", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t)
		s := start(t, &fakeserver.Options{Storage: pgfake.New(context.Background(), pool)})
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
	})

	// Three processes that start together on a database whose default
	// isolation is any of PostgreSQL's each migrate without error, and the
	// fake server's tables are there once.
	t.Run("processes migrate together under every default isolation", func(t *testing.T) {
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
					wg.Go(func() { assert.NoError(t, pgfake.Migrate(ctx, pool)) })
				}
				wg.Wait()
				var tables int
				require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables
				WHERE tablename IN ('fake_payments', 'fake_intents', 'fake_charges')`).Scan(&tables))
				assert.Equal(t, 3, tables)
			})
		}
	})
}

// syncBuffer is a log's destination that the server's goroutines write
// while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
