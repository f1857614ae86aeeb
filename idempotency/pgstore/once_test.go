package pgstore

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/long"
	"github.com/idemkit/idem/internal/pgtest"
)

// payDirect is a handler of the single-transaction mode: it writes its
// payment row through the request's transaction while it runs, and
// answers 500 instead when the request has an X-Fail header. hold, if not
// nil, is told when the row is written and waited on before answering.
func payDirect(hold func()) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		tx, ok := Tx(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), "INSERT INTO payments (id) VALUES ($1)", info.StableID); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if hold != nil {
			hold()
		}
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", "/payments/"+info.StableID)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("paid " + info.StableID))
	}
}

func newOnceServer(pool *pgxpool.Pool, h http.Handler, opts *Options) http.Handler {
	return idempotency.New(h, idempotency.Config{Store: New(pool, opts), Principal: anyone, OneTransaction: true, Expected: 3 * time.Second})
}

func post(h http.Handler, key, body string, fail bool) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	if fail {
		r.Header.Set("X-Fail", "1") // a header is not part of the fingerprint
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// withPayments returns newPool's pool with the payments table the handlers
// write. Each of configure, if any, changes the pool's configuration first.
func withPayments(t *testing.T, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pool := newPool(t, configure...)
	_, err := pool.Exec(context.Background(), "CREATE TABLE payments (id text PRIMARY KEY)")
	require.NoError(t, err)
	return pool
}

// TestOneTransaction checks the mode that runs the work and its record
// in one transaction: the effect and the answer commit together or not
// at all.
func TestOneTransaction(t *testing.T) {
	// A fresh key's effect and record commit together, a server error stores
	// neither, a retry replays, another body is 422.
	t.Run("a fresh key's effect and record commit together", func(t *testing.T) {
		pool := withPayments(t)
		h := newOnceServer(pool, payDirect(nil), nil)

		w := post(h, "k1", `{"amount":1}`, true)
		assert.Equal(t, http.StatusInternalServerError, w.Code)
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM payments"), "a server error's effect was kept")
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM idempotency_records"), "a server error left a record")

		w = post(h, "k1", `{"amount":1}`, false)
		require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		first := w.Body.String()
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED' AND owner = '' AND locked_until IS NULL"))

		w = post(h, "k1", `{"amount":1}`, false)
		assert.Equal(t, http.StatusCreated, w.Code)
		assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		assert.Equal(t, first, w.Body.String())
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))

		assert.Equal(t, http.StatusUnprocessableEntity, post(h, "k1", `{"amount":2}`, false).Code)
	})

	// While a request works a key, a request for it in the same process and
	// one in another process (another middleware on its own pool) answer 409
	// with Retry-After at once, and the lookup (Get) reads the key as
	// IN_PROGRESS; then the work commits and both replay it.
	t.Run("a request holds its key", func(t *testing.T) {
		pool := withPayments(t)
		working, finish := make(chan struct{}), make(chan struct{})
		h := newOnceServer(pool, payDirect(func() { close(working); <-finish }), nil)
		cfg := pool.Config()
		other, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		defer other.Close()
		elsewhere := newOnceServer(other, payDirect(nil), nil)

		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- post(h, "k", `{}`, false) }()
		<-working
		for name, srv := range map[string]http.Handler{"this process": h, "another process": elsewhere} {
			w := post(srv, "k", `{}`, false)
			assert.Equal(t, http.StatusConflict, w.Code, "%s: %s", name, w.Body.String())
			assert.Equal(t, "3", w.Header().Get("Retry-After"), name)
		}
		rec, found, err := New(other, nil).Get(context.Background(), idempotency.ID{Key: "k"}, time.Now())
		require.NoError(t, err)
		assert.True(t, found && rec.Status == idempotency.StatusInProgress, "the lookup reads %+v, %v while the work runs; want IN_PROGRESS", rec, found)
		close(finish)
		require.Equal(t, http.StatusCreated, (<-done).Code)
		for name, srv := range map[string]http.Handler{"this process": h, "another process": elsewhere} {
			w := post(srv, "k", `{}`, false)
			assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"), "%s: %d %s", name, w.Code, w.Body.String())
		}
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
	})

	// With every connection of the pool taken, a request answers 503 with
	// Retry-After once AcquireTimeout has passed, and stores nothing.
	t.Run("a wait for a connection is bounded", func(t *testing.T) {
		pool := withPayments(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
		h := newOnceServer(pool, payDirect(nil), &Options{AcquireTimeout: time.Millisecond})

		conn, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		w := post(h, "k", `{}`, false)
		conn.Release()
		assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.NotContains(t, w.Body.String(), "pgstore")
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM idempotency_records"))
		// (A store with a bound a round trip can meet: 1 ms also bounds the
		// first answer.)
		assert.Equal(t, http.StatusCreated, post(newOnceServer(pool, payDirect(nil), nil), "k", `{}`, false).Code,
			"the key is free once a connection is")
	})

	// While a request works a key on the pool's only connection, a duplicate
	// in the same process answers 409 at once instead of waiting for a
	// connection.
	t.Run("a duplicate takes no connection", func(t *testing.T) {
		pool := withPayments(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
		working, finish := make(chan struct{}), make(chan struct{})
		h := newOnceServer(pool, payDirect(func() { close(working); <-finish }), &Options{AcquireTimeout: 2 * time.Second})
		done := make(chan int)
		go func() { done <- post(h, "k", `{}`, false).Code }()
		<-working
		timer := time.AfterFunc(10*time.Second, func() { close(finish) }) // in case the duplicate waits
		w := post(h, "k", `{}`, false)
		if timer.Stop() {
			close(finish)
		}
		assert.Equal(t, http.StatusConflict, w.Code, w.Body.String())
		assert.Equal(t, http.StatusCreated, <-done)
	})

	// A duplicate in the same process whose client has gone while the first
	// request still reads the key's record answers 409 at once, and does not
	// read what the first finds while the first writes it (a data race,
	// which -race reports).
	t.Run("a duplicate gone while the first reads answers at once", func(t *testing.T) {
		var armed atomic.Bool
		acquiring, proceed := make(chan struct{}), make(chan struct{})
		pool := withPayments(t, func(cfg *pgxpool.Config) {
			cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
				if armed.CompareAndSwap(true, false) {
					close(acquiring)
					<-proceed
				}
				return true, nil
			}
		})
		h := newOnceServer(pool, payDirect(nil), &Options{AcquireTimeout: time.Minute})
		require.Equal(t, http.StatusCreated, post(h, "k", `{}`, false).Code)

		// The duplicate and the first go on at once, unordered. Where the
		// first ends its flight before the duplicate starts (a loaded machine
		// can schedule it so), the duplicate finds no flight and, its context
		// gone, cannot take a connection: a 500 its gone client never sees.
		// The scenario is repeated until the duplicate met the flight.
		for try := 0; ; try++ {
			require.Less(t, try, 50, "the duplicate never met the first request's flight")
			armed.Store(true)
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- post(h, "k", `{}`, false) }()
			<-acquiring // the first request holds the key's flight, before its read
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`)).WithContext(ctx)
			r.Header.Set("Idempotency-Key", "k")
			w := httptest.NewRecorder()
			dup := make(chan struct{})
			go func() {
				defer close(dup)
				h.ServeHTTP(w, r)
			}()
			close(proceed)
			<-dup
			assert.Equal(t, "true", (<-first).Header().Get("Idempotent-Replayed"))
			acquiring, proceed = make(chan struct{}), make(chan struct{})
			if w.Code == http.StatusConflict {
				return
			}
			require.Equal(t, http.StatusInternalServerError, w.Code, w.Body.String())
		}
	})

	// 300 concurrent requests with one key, spread over three server
	// processes on one database, whose handler takes 200 ms: the effect is
	// written once, and every answer is the 201 (fresh or replayed) or a
	// 409.
	t.Run("a storm over processes writes the effect once", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts three server processes")
		}
		pool := withPayments(t)
		dsn := pool.Config().ConnString()
		servers := []*server{startServer(t, dsn, "200ms"), startServer(t, dsn, "200ms"), startServer(t, dsn, "200ms")}
		codes := map[int]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 300 {
			wg.Go(func() {
				<-start
				code, _ := send(t, servers[i%3].url, "storm")
				mu.Lock()
				codes[code]++
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"), "the effect was written more than once")
		assert.Equal(t, 300, codes[http.StatusCreated]+codes[http.StatusConflict], "answers %v", codes)
		code, replayed := send(t, servers[0].url, "storm")
		assert.True(t, code == http.StatusCreated && replayed, "after the storm: %d, replayed %v", code, replayed)
		t.Logf("answers: %v", codes)
	})

	// A server process killed (SIGKILL) after its handler wrote the payment,
	// before the commit, leaves neither record nor payment; the retry, on
	// another process, does the work once.
	t.Run("an app killed mid-transaction leaves nothing", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts and kills a server process")
		}
		pool := withPayments(t)
		dsn := pool.Config().ConnString()
		doomed := startServer(t, dsn, "forever")
		sent := make(chan error, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, doomed.url+"/pay", strings.NewReader(`{"amount":1}`))
			req.Header.Set("Idempotency-Key", "k")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_ = resp.Body.Close()
				err = fmt.Errorf("the killed process answered %d", resp.StatusCode)
			}
			sent <- err
		}()
		require.Equal(t, "effect written", <-doomed.lines)
		require.NoError(t, doomed.cmd.Process.Kill())
		_ = doomed.cmd.Wait()
		assert.Error(t, <-sent, "the request to the killed process")
		// The database rolls the transaction back when it finds the
		// connection closed; wait until the dead process's session is gone.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND backend_type = 'client backend' AND state <> 'idle'`) > 0 {
			select {
			case <-ctx.Done():
				t.Fatal("the killed process's transaction is still open")
			case <-time.After(10 * time.Millisecond):
			}
		}
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM payments"), "the killed process's effect was kept")
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM idempotency_records"), "the killed process left a record")

		code, replayed := send(t, startServer(t, dsn, "0s").url, "k")
		assert.True(t, code == http.StatusCreated && !replayed, "the retry: %d, replayed %v", code, replayed)
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
	})

	// PostgreSQL with fsync and synchronous_commit on, killed (immediate
	// shutdown) right after a 201, keeps the record and the payment. Its WAL
	// writer flushes nothing on its own for 10 s, so only the commit's own
	// flush can have kept them.
	t.Run("a commit survives a PostgreSQL crash", func(t *testing.T) {
		long.Skip(t, "starts and crashes a PostgreSQL server of its own")
		srv, err := pgtest.Start(pgtest.Options{Durable: true, Settings: []string{"wal_writer_delay=10s"}})
		if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv(pgtest.EnvRequire) != "1" {
			t.Skip(err)
		}
		require.NoError(t, err)
		defer func() { assert.NoError(t, srv.Stop()) }()
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, srv.DSN("postgres"))
		require.NoError(t, err)
		require.NoError(t, Migrate(ctx, pool))
		_, err = pool.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY)")
		require.NoError(t, err)
		var syncCommit string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&syncCommit))
		require.Equal(t, "on", syncCommit)

		w := post(newOnceServer(pool, payDirect(nil), nil), "k", `{}`, false)
		require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		require.NoError(t, srv.Crash())
		pool.Close()
		require.NoError(t, srv.Restart())
		pool, err = pgxpool.New(ctx, srv.DSN("postgres"))
		require.NoError(t, err)
		defer pool.Close()

		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED'"), "the record was lost in the crash")
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"), "the payment was lost in the crash")
	})

	// Inside the single transaction a handler nests transactions as
	// savepoints (pgx.BeginFunc); a nested one that fails is undone alone
	// (the subtest of a handler that ends the transaction ends the
	// request's transaction itself).
	t.Run("nested transactions are savepoints", func(t *testing.T) {
		pool := withPayments(t)
		h := newOnceServer(pool, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, _ := Tx(r.Context())
			ctx := r.Context()
			kept := pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ('kept')")
				return err
			})
			undone := pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ('undone')"); err != nil {
					return err
				}
				return errors.New("changed its mind")
			})
			if kept != nil || undone == nil {
				http.Error(w, fmt.Sprint(kept, undone), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}), nil)
		w := post(h, "k", `{}`, false)
		require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments WHERE id = 'kept'"))
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM payments WHERE id = 'undone'"))
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED'"))
	})

	// A handler that ends the request's transaction itself (Commit or
	// Rollback on it, or COMMIT or ROLLBACK as SQL through it), then answers
	// 201, gets a 500 problem with no internal text, and no answer is
	// stored: the record never claims an effect that did not commit with it.
	// A retry with the key does the work again, cleanly. Only a COMMIT sent
	// as SQL commits the effect on its own, before the record; then the
	// retry does it again (see "One transaction").
	t.Run("a handler that ends the transaction gets a 500", func(t *testing.T) {
		for _, tc := range transactionEndings {
			t.Run(tc.name, func(t *testing.T) {
				pool := withPayments(t)
				var ended error
				h := newOnceServer(pool, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tx, _ := Tx(r.Context())
					if _, err := tx.Exec(r.Context(), "INSERT INTO payments (id) VALUES ('p1')"); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					ended = tc.end(r.Context(), tx) // and ignored: the handler answers 201
					w.WriteHeader(http.StatusCreated)
				}), nil)
				w := post(h, "k", `{}`, false)
				t.Logf("ending the transaction returned %v", ended)
				requireEndingFailed(t, pool, w, tc.committed)
				assert.Zero(t, count(t, pool, "SELECT count(*) FROM idempotency_records"), "a record was stored")

				// The retry does the work, with a handler that keeps the rule.
				h = newOnceServer(pool, payDirect(nil), nil)
				require.Equal(t, http.StatusCreated, post(h, "k", `{}`, false).Code)
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED'"))
			})
		}
	})

	// A handler that panics, one whose request is canceled while its
	// statement runs, and one whose statement fails, each after writing its
	// payment and each answering 201 if it returns: nothing commits, no
	// answer is stored, the transaction ends on the server too (pgx, closing
	// the connection of a canceled statement, sends the server a cancel
	// request, so the statement does not keep running there, holding the
	// key), no connection stays taken, and the retry does the work once.
	t.Run("a handler's failure commits nothing", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			then func(ctx context.Context, cancel context.CancelFunc, tx pgx.Tx, pool *pgxpool.Pool)
		}{
			{"panics", func(context.Context, context.CancelFunc, pgx.Tx, *pgxpool.Pool) { panic("the handler's bug") }},
			{"canceled mid-statement", func(ctx context.Context, cancel context.CancelFunc, tx pgx.Tx, pool *pgxpool.Pool) {
				go func() {
					// Until the statement runs.
					for {
						var running bool
						_ = pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
						WHERE datname = current_database() AND state = 'active' AND query LIKE 'SELECT pg_sleep%')`).Scan(&running)
						if running {
							cancel()
							return
						}
						time.Sleep(time.Millisecond)
					}
				}()
				_, _ = tx.Exec(ctx, "SELECT pg_sleep(600)")
			}},
			{"a statement fails", func(ctx context.Context, _ context.CancelFunc, tx pgx.Tx, _ *pgxpool.Pool) {
				_, _ = tx.Exec(ctx, "INSERT INTO payments (id) VALUES (NULL)")
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				pool := withPayments(t)
				var runs atomic.Int32
				h := newOnceServer(pool, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					tx, _ := Tx(r.Context())
					if _, err := tx.Exec(r.Context(), "INSERT INTO payments (id) VALUES ('p')"); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					if runs.Load() == 1 {
						tc.then(r.Context(), r.Context().Value(cancelKey{}).(context.CancelFunc), tx, pool)
					}
					w.WriteHeader(http.StatusCreated)
				}), nil)
				ctx, cancel := context.WithCancel(context.Background())
				ctx = context.WithValue(ctx, cancelKey{}, cancel)
				r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`)).WithContext(ctx)
				r.Header.Set("Idempotency-Key", "k")
				w := httptest.NewRecorder()
				var panicked any
				func() {
					defer func() { panicked = recover() }()
					h.ServeHTTP(w, r)
				}()
				cancel()
				assert.Equal(t, tc.name == "panics", panicked != nil, "panicked: %v", panicked)
				assert.NotEqual(t, http.StatusCreated, w.Code, w.Body.String())
				// The transaction ends soon, on the server too, and its
				// connection is given back or destroyed. (Waits for an
				// outcome, bounded far below the statement's 600 s.)
				require.Eventually(t, func() bool {
					return count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND xact_start IS NOT NULL") == 1 &&
						pool.Stat().AcquiredConns() == 0
				}, 20*time.Second, 5*time.Millisecond, "the transaction still runs on the server, or its connection is still taken")
				assert.Zero(t, count(t, pool, "SELECT count(*) FROM payments"), "the effect committed")
				assert.Zero(t, count(t, pool, "SELECT count(*) FROM idempotency_records"), "a record was stored")

				require.Equal(t, http.StatusCreated, post(h, "k", `{}`, false).Code, "the retry")
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
				assert.Equal(t, "true", post(h, "k", `{}`, false).Header().Get("Idempotent-Replayed"))
				assert.EqualValues(t, 2, runs.Load())
			})
		}
	})

	// A key whose record the lease mode left IN_PROGRESS (same table; a
	// deploy that switched modes, or routes that share keys) reaches a
	// single-transaction handler. While the lease lives, the answer is 409
	// with Retry-After and the handler does not run; once it has ended (its
	// worker died, or gave the record up after a server error), the request
	// takes the record over in its one transaction, with the record's stable
	// id: the take-over, the effect and the COMPLETED record commit
	// together, and the retry replays. Another body is 422.
	t.Run("a lease record is answered while it lives and taken over after", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			leave   func(w http.ResponseWriter) // the lease-mode handler
			advance time.Duration               // then the clock moves
		}{
			{"a dead worker's lease", func(http.ResponseWriter) { panic(http.ErrAbortHandler) }, 31 * time.Second},
			{"a record given up after a server error", func(w http.ResponseWriter) { w.WriteHeader(http.StatusBadGateway) }, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				pool := withPayments(t)
				clk := clock.NewManual(time.Now())
				store := New(pool, &Options{Clock: clk})
				lease := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.leave(w) }),
					idempotency.Config{Store: store, Principal: anyone, Clock: clk, Lease: 30 * time.Second})
				func() {
					defer func() { _ = recover() }()
					post(lease, "k", `{"amount":1}`, false)
				}()
				var stableID string
				require.NoError(t, pool.QueryRow(context.Background(),
					"SELECT stable_id FROM idempotency_records WHERE status = 'IN_PROGRESS'").Scan(&stableID))

				var runs atomic.Int32
				once := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					info, _ := idempotency.FromContext(r.Context())
					tx, ok := Tx(r.Context())
					if !ok {
						http.Error(w, "no transaction", http.StatusInternalServerError)
						return
					}
					if _, err := tx.Exec(r.Context(), "INSERT INTO payments (id) VALUES ($1)", info.StableID); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					w.WriteHeader(http.StatusCreated)
					_, _ = fmt.Fprintf(w, "paid %s takeover=%v", info.StableID, info.Takeover)
				}), idempotency.Config{Store: store, Principal: anyone, Clock: clk, Lease: 30 * time.Second,
					Expected: 3 * time.Second, OneTransaction: true})

				if tc.advance > 0 {
					w := post(once, "k", `{"amount":1}`, false)
					assert.Equal(t, http.StatusConflict, w.Code, w.Body.String())
					assert.Equal(t, "3", w.Header().Get("Retry-After"))
					assert.Zero(t, runs.Load(), "the handler ran under a live lease")
					clk.Advance(tc.advance)
				}
				assert.Equal(t, http.StatusUnprocessableEntity, post(once, "k", `{"amount":2}`, false).Code)
				w := post(once, "k", `{"amount":1}`, false)
				require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
				assert.Equal(t, "paid "+stableID+" takeover=true", w.Body.String())
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments WHERE id = $1", stableID))
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED' AND stable_id = $1 AND owner = '' AND locked_until IS NULL", stableID))

				w = post(once, "k", `{"amount":1}`, false)
				assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"), "%d %s", w.Code, w.Body.String())
				assert.EqualValues(t, 1, runs.Load())
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
			})
		}
	})

	// A lease-mode worker, which takes no advisory lock, writes the key's
	// record while RunOnce runs the work: the work rolls back and RunOnce
	// returns that record, whether the key had no record when RunOnce read
	// it (a plain insert) or an expired one (the insert that replaces it).
	t.Run("the work yields to a lease record written meanwhile", func(t *testing.T) {
		pool := withPayments(t)
		ctx := context.Background()
		t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		clk := clock.NewManual(t0)
		s := New(pool, &Options{Clock: clk})
		rec := func(key, owner string) *idempotency.Record {
			now := clk.Now()
			return &idempotency.Record{ID: idempotency.ID{Principal: "p", Key: key}, Fingerprint: sha256.Sum256([]byte("body")),
				FingerprintVersion: 1, Status: idempotency.StatusInProgress, StableID: "stable-" + owner, Owner: owner,
				LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		}
		yields := func(t *testing.T, key string) {
			existing, err := s.RunOnce(ctx, rec(key, "once"), func(ctx context.Context, _ *idempotency.Record) (*idempotency.Response, error) {
				if _, inserted, err := s.Insert(context.Background(), rec(key, "lease")); err != nil || !inserted {
					return nil, fmt.Errorf("the lease-mode insert: %v, %v", inserted, err)
				}
				tx, _ := Tx(ctx)
				if _, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ($1)", key); err != nil {
					return nil, err
				}
				return &idempotency.Response{StatusCode: 201, Header: http.Header{}, Body: []byte("paid")}, nil
			})
			require.NoError(t, err)
			require.NotNil(t, existing, "RunOnce committed its work over the lease-mode record")
			assert.Equal(t, "lease", existing.Owner)
			assert.Equal(t, 0, count(t, pool, "SELECT count(*) FROM payments WHERE id = $1", key), "the work's effect committed")
		}
		t.Run("a record that appears over a fresh key", func(t *testing.T) {
			yields(t, "fresh")
		})
		t.Run("a record that replaces an expired one meanwhile", func(t *testing.T) {
			_, inserted, err := s.Insert(ctx, rec("expired", "old"))
			require.NoError(t, err)
			require.True(t, inserted)
			clk.Advance(2 * time.Hour)
			yields(t, "expired")
		})
	})

	// While RunOnce works a lease-mode record it took over, the record's old
	// worker, still running, tries to complete it: its Complete waits for
	// RunOnce's commit, then fails with ErrNotOwner, and its effect is not
	// stored; RunOnce's work commits.
	t.Run("RunOnce holds the record it takes over", func(t *testing.T) {
		pool := withPayments(t)
		clk := clock.NewManual(time.Now())
		s := New(pool, &Options{Clock: clk})
		ctx := context.Background()
		id := idempotency.ID{Key: "k"}
		rec := func(owner string) *idempotency.Record {
			now := clk.Now()
			return &idempotency.Record{ID: id, Fingerprint: [sha256.Size]byte{1}, FingerprintVersion: 1,
				Status: idempotency.StatusInProgress, StableID: "stable-" + owner, Owner: owner,
				LockedUntil: now.Add(time.Second), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		}
		_, inserted, err := s.Insert(ctx, rec("old"))
		require.NoError(t, err)
		require.True(t, inserted)
		clk.Advance(2 * time.Second)

		completed := make(chan error, 1)
		existing, err := s.RunOnce(ctx, rec("new"), func(ctx context.Context, abandoned *idempotency.Record) (*idempotency.Response, error) {
			tx, _ := Tx(ctx)
			if _, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ('new')"); err != nil {
				return nil, err
			}
			go func() {
				completed <- s.Complete(context.Background(), id, "old", &idempotency.Response{StatusCode: 201}, func(ctx context.Context) error {
					tx, _ := Tx(ctx)
					_, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ('old')")
					return err
				})
			}()
			// Until the old worker's Complete returns or waits for the row.
			for {
				select {
				case err := <-completed:
					completed <- err
					return &idempotency.Response{StatusCode: 201}, nil
				default:
				}
				var waiting bool
				if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
					return nil, err
				}
				if waiting {
					return &idempotency.Response{StatusCode: 201}, nil
				}
				time.Sleep(time.Millisecond)
			}
		})
		require.NoError(t, err)
		assert.Nil(t, existing, "RunOnce's work was not stored")
		assert.ErrorIs(t, <-completed, idempotency.ErrNotOwner, "the old worker completed a record taken over")
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments WHERE id = 'new'"))
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM payments WHERE id = 'old'"))
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED' AND stable_id = 'stable-old'"))
	})

	// RunOnce judges a record it reads as the lease mode does. A record past
	// its retention whose worker still holds its lease is live: the work
	// does not run, and the record answers. Once the lease has ended too,
	// the key is free.
	t.Run("RunOnce judges a record past its retention as the lease mode does", func(t *testing.T) {
		pool := withPayments(t)
		clk := clock.NewManual(time.Now())
		s := New(pool, &Options{Clock: clk})
		ctx := context.Background()
		rec := func(owner string) *idempotency.Record {
			return &idempotency.Record{ID: idempotency.ID{Key: "k"}, Fingerprint: [sha256.Size]byte{1}, FingerprintVersion: 1,
				Status: idempotency.StatusInProgress, StableID: "stable-" + owner, Owner: owner,
				LockedUntil: clk.Now().Add(time.Minute), CreatedAt: clk.Now(), ExpiresAt: clk.Now().Add(time.Second)}
		}
		_, inserted, err := s.Insert(ctx, rec("old"))
		require.NoError(t, err)
		require.True(t, inserted)
		var runs atomic.Int32
		do := func(context.Context, *idempotency.Record) (*idempotency.Response, error) {
			runs.Add(1)
			return &idempotency.Response{StatusCode: http.StatusCreated}, nil
		}

		t.Run("under its worker's live lease the work does not run", func(t *testing.T) {
			clk.Advance(2 * time.Second) // past the retention, within the lease
			existing, err := s.RunOnce(ctx, rec("new"), do)
			require.NoError(t, err)
			assert.Zero(t, runs.Load(), "the work ran beside the record's live worker")
			require.NotNil(t, existing)
			assert.Equal(t, idempotency.StatusInProgress, existing.Status)
			assert.Equal(t, "old", existing.Owner)
		})
		t.Run("once the lease has ended the key is free", func(t *testing.T) {
			clk.Advance(2 * time.Minute)
			existing, err := s.RunOnce(ctx, rec("new"), do)
			require.NoError(t, err)
			assert.Nil(t, existing)
			assert.EqualValues(t, 1, runs.Load())
		})
	})

	// The transaction RunOnce gave the handler, and a savepoint of it,
	// refuse every use once RunOnce has returned (pgx.ErrTxClosed), so that
	// a handler that kept them cannot write through the connection into the
	// transaction of whichever request holds it next.
	t.Run("the transaction is refused once RunOnce returned", func(t *testing.T) {
		// One connection: the next user gets the one the handler had.
		pool := withPayments(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
		ctx := context.Background()
		rec := inProgress("k", "w1", t0)
		var kept, keptSavepoint pgx.Tx
		existing, err := New(pool, nil).RunOnce(ctx, rec, func(ctx context.Context, _ *idempotency.Record) (*idempotency.Response, error) {
			kept, _ = Tx(ctx)
			var err error
			if keptSavepoint, err = kept.Begin(ctx); err != nil {
				return nil, err
			}
			_, err = kept.Exec(ctx, "INSERT INTO payments VALUES ('p1')")
			return &idempotency.Response{StatusCode: 201}, err
		})
		require.NoError(t, err)
		require.Nil(t, existing)

		other, err := pool.Begin(ctx) // another request holds the connection now
		require.NoError(t, err)
		_, err = kept.Exec(ctx, "INSERT INTO payments VALUES ('late')")
		assert.ErrorIs(t, err, pgx.ErrTxClosed, "Exec")
		assert.ErrorIs(t, keptSavepoint.Rollback(ctx), pgx.ErrTxClosed, "savepoint's Rollback")
		require.NoError(t, other.Commit(ctx))
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"), "writes after RunOnce returned")
	})

	// It counts what a fresh key costs in round trips to the database, in
	// each query mode the store supports.
	t.Run("a fresh key's round trips are counted", func(t *testing.T) {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			t.Run(mode.String(), func(t *testing.T) {
				trips := &roundTrips{}
				pool := benchPool(t, func(cfg *pgxpool.Config) {
					cfg.ConnConfig.DefaultQueryExecMode = mode
					cfg.ConnConfig.Tracer = trips
					cfg.MaxConns = 1 // one connection, its statements prepared once
				})
				once := idempotency.New(benchPay(pool), idempotency.Config{Store: New(pool, nil),
					Principal: func(*http.Request) string { return "bench" }, OneTransaction: true})
				measure := func(h http.Handler) int64 {
					benchPost(t, h, uuid.NewString()) // prepares what the mode prepares
					before := trips.n.Load()
					benchPost(t, h, uuid.NewString())
					return trips.n.Load() - before
				}
				t.Run("the bare handler takes three", func(t *testing.T) {
					if n := measure(benchPay(pool)); n != 3 {
						t.Errorf("%d round trips, want 3 (BEGIN, INSERT, COMMIT)", n)
					}
				})
				t.Run("a fresh key takes two besides the handler's", func(t *testing.T) {
					if n := measure(once); n != 3 {
						t.Errorf("%d round trips, want 3 (BEGIN with the lock and the read; the handler's INSERT; the record with COMMIT)", n)
					}
				})
			})
		}
	})
}

// The test binary serves as a server process of its own when envServe
// names a database: startServer runs it.
const (
	envServe = "PGSTORE_TEST_SERVE_DSN"
	// envDelay is how long its handler takes after writing the payment;
	// "forever" blocks.
	envDelay = "PGSTORE_TEST_SERVE_DELAY"
)

// serve runs the single-transaction middleware over the database dsn on
// 127.0.0.1, prints "listening ADDR", and "effect written" whenever its
// handler has written a payment row; it serves until killed.
func serve(dsn string) int {
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	delay := os.Getenv(envDelay)
	var mu sync.Mutex
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(s)
	}
	h := newOnceServer(pool, payDirect(func() {
		say("effect written")
		if delay == "forever" {
			select {}
		}
		if d, err := time.ParseDuration(delay); err == nil {
			time.Sleep(d)
		}
	}), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	say("listening " + ln.Addr().String())
	return func() int { _ = http.Serve(ln, h); return 1 }()
}

// server is a server process started by startServer.
type server struct {
	cmd   *exec.Cmd
	url   string
	lines chan string // its output after the address
}

// startServer starts the test binary as a server process on the database
// dsn, its handler taking delay, and waits for its address.
func startServer(t *testing.T, dsn, delay string) *server {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envServe+"="+dsn, envDelay+"="+delay)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s := &server{cmd: cmd, lines: make(chan string, 1000)}
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan(), "the server process printed nothing")
	addr, ok := strings.CutPrefix(sc.Text(), "listening ")
	require.True(t, ok, "the server process printed %q", sc.Text())
	s.url = "http://" + addr
	go func() {
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	return s
}

func send(t *testing.T, url, key string) (int, bool) {
	req, err := http.NewRequest(http.MethodPost, url+"/pay", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if !assert.NoError(t, err) {
		return 0, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
}

// transactionEndings are the ways a handler (or an effect) ends the
// request's transaction that the store gave it, after writing a payment
// row 'p1' through it: the store must then fail the request and store no
// answer.
var transactionEndings = []struct {
	name      string
	end       func(ctx context.Context, tx pgx.Tx) error
	committed bool // 'p1' committed on its own
}{
	{"Commit", func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }, false},
	{"Rollback", func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }, false},
	{"SQL COMMIT", func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT"); return err }, true},
	{"SQL ROLLBACK", func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "ROLLBACK"); return err }, false},
	{"SQL ROLLBACK then BEGIN", func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "ROLLBACK; BEGIN"); err != nil {
			return err
		}
		// Written in the transaction the handler began: it must not
		// commit either.
		_, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ('p2')")
		return err
	}, false},
	{"SQL COMMIT on the connection", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Conn().Exec(ctx, "COMMIT")
		return err
	}, true},
}

// requireEndingFailed checks the answer w to a request whose handler (or
// effect) ended its transaction as tc does: a 500 problem with no internal
// text, and the payment 'p1' committed only if tc commits it on its own.
// It then deletes the payments, for the retry to count its own.
func requireEndingFailed(t *testing.T, pool *pgxpool.Pool, w *httptest.ResponseRecorder, committed bool) {
	t.Helper()
	assert.Equal(t, http.StatusInternalServerError, w.Code, w.Body.String())
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	assert.NotContains(t, w.Body.String(), "pgstore")
	want := 0
	if committed {
		want = 1
	}
	assert.Equal(t, want, count(t, pool, "SELECT count(*) FROM payments"))
	_, err := pool.Exec(context.Background(), "DELETE FROM payments")
	require.NoError(t, err)
}

// cancelKey carries the request's cancel to its handler.
type cancelKey struct{}

// roundTrips counts a connection's round trips to the server: each
// statement sent alone, each batch, each statement prepared apart.
type roundTrips struct {
	n atomic.Int64
}

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (c *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// TestLockKey pins the advisory lock of a key. Two versions of the store
// that disagree on it would run one key twice at once.
func TestLockKey(t *testing.T) {
	c := caller(idempotency.ID{Principal: "acct_42"})
	t.Run("a key's lock is the same in every version", func(t *testing.T) {
		assert.Equal(t, int64(-8323046179165117858), lockKey(c, "4f1c2a9e-0b7d-4c3e-9a51-6d2e8f0b1c7a"))
	})
	t.Run("a key longer than the stack buffer gets the same lock", func(t *testing.T) {
		assert.Equal(t, int64(4081109726884768776), lockKey(c, strings.Repeat("k", 255)))
	})
	t.Run("the caller and the key are separated", func(t *testing.T) {
		assert.NotEqual(t, lockKey(c, "ab"), lockKey(c+"a", "b"))
	})
}
