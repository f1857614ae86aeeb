package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/long"
	"github.com/idemkit/idem/internal/pgtest"
)

// startServer starts a PostgreSQL server of the test's own, stopped when
// the test ends; it skips without binaries unless they are required.
func startOwnServer(t *testing.T, opts pgtest.Options) *pgtest.Server {
	t.Helper()
	srv, err := pgtest.Start(opts)
	if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv(pgtest.EnvRequire) != "1" {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Stop()) })
	return srv
}

// startPair starts a primary and an asynchronous standby made from it with
// pg_basebackup -R, both stopped when the test ends.
func startPair(t *testing.T, opts pgtest.Options) *pgtest.Pair {
	t.Helper()
	p, err := pgtest.StartPair(opts)
	if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv(pgtest.EnvRequire) != "1" {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Stop()) })
	return p
}

// openPool opens a pool on dsn prepared by ConfigurePool, as a program
// that follows the docs does.
func openPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// asRole is dsn with its user replaced by role.
func asRole(dsn, role string) string { return strings.Replace(dsn, "//postgres@", "//"+role+"@", 1) }

// quiet is a logger that drops what it is given.
var quiet = slog.New(slog.DiscardHandler)

// logBuffer is a logger whose lines a test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{mu: &l.mu, w: &l.buf}, nil))
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestSyncCommit: the store's commits run with synchronous_commit at
// least on, whatever the session had, and keep remote_apply.
func TestSyncCommit(t *testing.T) {
	pool := newPool(t)
	ctx := context.Background()
	for _, c := range []struct{ from, want string }{
		{"off", "on"}, {"local", "on"}, {"remote_write", "on"}, {"on", "on"}, {"remote_apply", "remote_apply"},
	} {
		t.Run(fmt.Sprintf("%s becomes %s", c.from, c.want), func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SELECT set_config('synchronous_commit', $1, true)", c.from)
			require.NoError(t, err)
			var got string
			require.NoError(t, tx.QueryRow(ctx, "SELECT "+syncCommitSQL).Scan(&got))
			assert.Equal(t, c.want, got)
		})
	}
}

// crashable is a durable server that a test crashes (an immediate
// shutdown) and restarts, with a pool on it.
type crashable struct {
	srv  *pgtest.Server
	pool *pgxpool.Pool
}

// crash crashes the server, closes the pool, restarts the server and opens
// a new pool. wait, if not nil, runs after the crash and before the pool
// closes: the requests that ran end there.
func (c *crashable) crash(t *testing.T, wait func()) {
	t.Helper()
	require.NoError(t, c.srv.Crash())
	if wait != nil {
		wait()
	}
	c.pool.Close()
	require.NoError(t, c.srv.Restart())
	var err error
	c.pool, err = pgxpool.New(context.Background(), c.srv.DSN("postgres"))
	require.NoError(t, err)
}

// TestCrash (issue 32, case 2): a server with synchronous_commit off,
// whose WAL writer flushes nothing on its own for 10 s, crashed (an
// immediate shutdown) at once. Each record the middleware acted on is
// still there after crash recovery: the store raises synchronous_commit
// for its own commits.
func TestCrash(t *testing.T) {
	long.Skip(t, "starts a PostgreSQL server with synchronous_commit off and crashes it four times")
	srv := startOwnServer(t, pgtest.Options{Durable: true, Settings: []string{"synchronous_commit=off", "wal_writer_delay=10s"}})
	ctx := context.Background()
	c := &crashable{srv: srv}
	var err error
	c.pool, err = pgxpool.New(ctx, srv.DSN("postgres"))
	require.NoError(t, err)
	defer func() { c.pool.Close() }()
	require.NoError(t, Migrate(ctx, c.pool))
	_, err = c.pool.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY)")
	require.NoError(t, err)
	newAccount(t, c.pool)
	_, err = c.pool.Exec(ctx, "CHECKPOINT") // the schema is durable
	require.NoError(t, err)

	t.Run("the IN_PROGRESS record survives a crash while the handler runs", func(t *testing.T) {
		running, release := make(chan struct{}), make(chan struct{})
		h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(running) // the provider is called here, under the record's stable id
			<-release
			w.WriteHeader(http.StatusCreated)
		}), idempotency.Config{Store: New(c.pool, nil), Principal: anyone})
		done := make(chan int)
		go func() { done <- post(h, "in-progress", `{}`, false).Code }()
		<-running
		c.crash(t, func() { close(release); <-done })
		assert.Equal(t, 1, count(t, c.pool, "SELECT count(*) FROM idempotency_records WHERE key = 'in-progress' AND status = 'IN_PROGRESS'"),
			"the handler ran, and the crash lost its IN_PROGRESS record: a retry runs it again")
	})
	// Three rounds: a commit left to the WAL writer survives a crash when
	// the writer happens to wake between the answer and the crash (a full
	// page, its 10 s timer). One round alone can miss the loss.
	t.Run("a completed record survives a crash after its answer", func(t *testing.T) {
		for round := range 3 {
			h := idempotency.New(http.HandlerFunc(payHandler), idempotency.Config{Store: New(c.pool, nil), Principal: anyone})
			key := fmt.Sprintf("completed-%d", round)
			w := post(h, key, `{}`, false)
			require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
			c.crash(t, nil)
			assert.Equal(t, 1, count(t, c.pool, "SELECT count(*) FROM idempotency_records WHERE key = '"+key+"' AND status = 'COMPLETED'"),
				"round %d: the answer was sent, and the crash lost its record", round)
			assert.Equal(t, round+1, count(t, c.pool, "SELECT count(*) FROM payments"), "round %d: the payment was lost with it", round)
		}
	})
	t.Run("one transaction's record survives a crash though the handler turned synchronous_commit off", func(t *testing.T) {
		// The sessions have synchronous_commit on: only the handler's
		// SET LOCAL turns it off.
		pool, err := pgxpool.New(ctx, srv.DSN("postgres")+"&synchronous_commit=on")
		require.NoError(t, err)
		defer pool.Close()
		var setting string
		require.NoError(t, pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
		require.Equal(t, "on", setting)
		h := newOnceServer(pool, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, _ := Tx(r.Context())
			if _, err := tx.Exec(r.Context(), "SET LOCAL synchronous_commit = off"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			payDirect(nil)(w, r)
		}), nil)
		w := post(h, "once", `{}`, false)
		require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		c.crash(t, pool.Close)
		assert.Equal(t, 1, count(t, c.pool, "SELECT count(*) FROM idempotency_records WHERE key = 'once' AND status = 'COMPLETED'"),
			"the answer was sent, and the crash lost its record")
	})
	t.Run("a take-over survives a crash while its handler runs", func(t *testing.T) {
		store := New(c.pool, nil)
		rec := inProgress("taken-over", "dead", time.Now())
		rec.LockedUntil = rec.CreatedAt // its lease has ended
		_, inserted, err := store.Insert(ctx, rec)
		require.NoError(t, err)
		require.True(t, inserted)
		now := time.Now()
		taken, err := store.TakeOver(ctx, rec.ID, "dead", "alive", now, now.Add(time.Minute))
		require.NoError(t, err)
		require.True(t, taken)
		c.crash(t, nil)
		assert.Equal(t, 1, count(t, c.pool, "SELECT count(*) FROM idempotency_records WHERE key = 'taken-over' AND owner = 'alive'"),
			"the handler runs under the take-over, and the crash lost it: another worker takes the record over again")
	})
	t.Run("a release survives a crash", func(t *testing.T) {
		store := New(c.pool, nil)
		rec := inProgress("released", "worker", time.Now())
		_, inserted, err := store.Insert(ctx, rec)
		require.NoError(t, err)
		require.True(t, inserted)
		require.NoError(t, store.Release(ctx, rec.ID, "worker"))
		c.crash(t, nil)
		assert.Zero(t, count(t, c.pool, "SELECT count(*) FROM idempotency_records WHERE key = 'released'"),
			"the key was freed, and the crash brought its IN_PROGRESS record back")
	})
	t.Run("a processed message survives a crash", func(t *testing.T) {
		var ran atomic.Int32
		done, err := NewInbox(c.pool).Process(ctx, "consumer", "message", credit(&ran))
		require.NoError(t, err)
		require.True(t, done)
		c.crash(t, nil)
		assert.Equal(t, 1, count(t, c.pool, "SELECT count(*) FROM idempotency_inbox WHERE message_id = 'message'"),
			"the message was acknowledged, and the crash lost its record: its next delivery is processed again")
	})
}

// TestFailover (issue 32, case 1): a primary and a synchronous standby
// made by pg_basebackup; the store's role has synchronous_commit = local
// by default, which does not wait for the standby. The standby then
// receives nothing (its WAL sender is held), the primary crashes and the
// standby is promoted. Whatever the middleware acted on before the crash
// (an IN_PROGRESS record under which the handler ran, a 201 in either
// mode) is on the new primary, and a retry there runs nothing twice.
func TestFailover(t *testing.T) {
	long.Skip(t, "starts a primary and a synchronous standby, crashes the primary and promotes the standby")
	pair := startPair(t, pgtest.Options{Durable: true})
	require.NoError(t, pair.MakeSynchronous())
	ctx := context.Background()
	admin := openPool(t, pair.Primary.DSN("postgres"))
	for _, sql := range []string{
		"CREATE ROLE app LOGIN",
		"ALTER ROLE app SET synchronous_commit = local",
		"GRANT CREATE ON SCHEMA public TO app",
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err)
	}
	pool := openPool(t, asRole(pair.Primary.DSN("postgres"), "app"))
	var setting string
	require.NoError(t, pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
	require.Equal(t, "local", setting)
	require.NoError(t, Migrate(ctx, pool))
	_, err := pool.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY)")
	require.NoError(t, err)

	var charges sync.Map // key -> *atomic.Int32: the provider's charges
	charge := func(key string) int32 {
		n, _ := charges.LoadOrStore(key, new(atomic.Int32))
		return n.(*atomic.Int32).Add(1)
	}
	charged := func(key string) int32 {
		n, _ := charges.LoadOrStore(key, new(atomic.Int32))
		return n.(*atomic.Int32).Load()
	}
	// The lease mode's handler charges a provider, then stores its
	// payment with the COMPLETED record.
	var ran atomic.Bool
	lease := func(pool *pgxpool.Pool) http.Handler {
		return idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Store(true)
			charge(r.Header.Get("Idempotency-Key"))
			payHandler(w, r)
		}), idempotency.Config{Store: New(pool, nil), Principal: anyone})
	}
	once := func(pool *pgxpool.Pool) http.Handler {
		return newOnceServer(pool, payDirect(nil), nil)
	}

	// Replicated as usual: the standby has it.
	require.Equal(t, http.StatusCreated, post(once(pool), "before", `{}`, false).Code)

	require.NoError(t, pair.PauseReplication())
	// waiting counts the store's commits that wait for the standby.
	waiting := func() int {
		return count(t, admin, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app' AND wait_event = 'SyncRep'")
	}
	// settle waits until the request answered or a commit of it waits
	// for the standby (want waiting commits).
	settle := func(done <-chan int, want int) (int, bool) {
		deadline := time.After(time.Minute)
		for {
			select {
			case code := <-done:
				return code, true
			case <-deadline:
				t.Fatal("the request neither answered nor waited for the standby")
			case <-time.After(10 * time.Millisecond):
			}
			if waiting() >= want {
				return 0, false
			}
		}
	}
	leaseDone, onceDone := make(chan int, 1), make(chan int, 1)
	go func() { leaseDone <- post(lease(pool), "lease", `{}`, false).Code }()
	leaseCode, leaseAnswered := settle(leaseDone, 1)
	go func() { onceDone <- post(once(pool), "once", `{}`, false).Code }()
	want := 1
	if leaseAnswered {
		want = 0
	}
	onceCode, onceAnswered := settle(onceDone, want+1)
	leaseRan := ran.Load()

	require.NoError(t, pair.Failover())
	if !leaseAnswered {
		leaseCode = <-leaseDone
	}
	if !onceAnswered {
		onceCode = <-onceDone
	}
	t.Logf("before the crash: the lease handler ran %v, answered %d; one transaction answered %d", leaseRan, leaseCode, onceCode)

	promoted := openPool(t, asRole(pair.Standby.DSN("postgres"), "app"))
	recordOf := func(key string) string {
		var status string
		err := promoted.QueryRow(ctx, "SELECT status FROM idempotency_records WHERE key = $1", key).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return "none"
		}
		require.NoError(t, err)
		return status
	}
	assert.Equal(t, idempotency.StatusCompleted, recordOf("before"), "a record replicated before the crash")
	if leaseRan {
		assert.NotEqual(t, "none", recordOf("lease"), "the handler ran under an IN_PROGRESS record that the failover lost")
	}
	if leaseCode == http.StatusCreated {
		assert.Equal(t, idempotency.StatusCompleted, recordOf("lease"), "the lease mode answered 201, and the failover lost its record")
	}
	if onceCode == http.StatusCreated {
		assert.Equal(t, idempotency.StatusCompleted, recordOf("once"), "one transaction answered 201, and the failover lost its record")
	}
	for _, code := range []int{leaseCode, onceCode} {
		assert.NotContains(t, []int{http.StatusOK, http.StatusNotFound, http.StatusUnprocessableEntity}, code)
	}

	// The clients retry on the new primary. (A lease-mode record left
	// IN_PROGRESS answers 409 until its lease ends, and is then taken over
	// under the same stable id; a 409 is fine here.)
	w := post(lease(promoted), "lease", `{}`, false)
	assert.Contains(t, []int{http.StatusCreated, http.StatusConflict}, w.Code, w.Body.String())
	assert.LessOrEqual(t, charged("lease"), int32(1), "the provider charged twice under one key")
	w = post(once(promoted), "once", `{}`, false)
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	if onceCode == http.StatusCreated {
		assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"), "a 201 was followed by a second payment under its key")
	}
}

// TestOpen: Open refuses a database that may lose what the store commits
// on a crash of its machine.
func TestOpen(t *testing.T) {
	ctx := context.Background()
	t.Run("fsync off is refused", func(t *testing.T) {
		pool := newPool(t) // the tests' shared server runs without fsync
		var fsync string
		require.NoError(t, pool.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
		if fsync != "off" {
			t.Skip("the tests' server runs with fsync on")
		}
		_, err := Open(ctx, pool, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "fsync off")
	})

	long.Skip(t, "starts a PostgreSQL server and a logical replication client")
	t.Run("a logical replication sender is not a standby", func(t *testing.T) {
		srv := startOwnServer(t, pgtest.Options{Durable: true, Settings: []string{"wal_level=logical"}})
		recvlogical, err := srv.Tool("pg_recvlogical")
		require.NoError(t, err)
		conn := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port()), "-U", "postgres", "-d", "postgres", "--slot", "consumer"}
		out, err := exec.Command(recvlogical, append(conn, "--create-slot")...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		cmd := exec.Command(recvlogical, append(conn, "--start", "-f", os.DevNull)...)
		require.NoError(t, cmd.Start())
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		pool := openPool(t, srv.DSN("postgres"))
		// The sender shows in pg_stat_replication before it takes its
		// slot: wait for both.
		require.Eventually(t, func() bool {
			return count(t, pool, "SELECT count(*) FROM pg_stat_replication") == 1 &&
				count(t, pool, "SELECT count(*) FROM pg_replication_slots WHERE active_pid IS NOT NULL") == 1
		}, time.Minute, 10*time.Millisecond, "the logical sender streams")
		var logs logBuffer
		_, err = Open(ctx, pool, &Options{Logger: logs.logger()})
		assert.NoError(t, err)
		assert.Empty(t, logs.String())
	})
}

// TestStandby (issue 32, case 1): a primary with fsync on and
// full_page_writes off, and a standby made from it by pg_basebackup.
// Open refuses an asynchronous standby unless the operator accepts the
// risk, warns when it cannot tell; the store's reads on the standby are
// refused, never a miss; a commit canceled while it waits for the
// synchronous standby is never taken for durable.
func TestStandby(t *testing.T) {
	long.Skip(t, "starts a primary and a standby")
	pair := startPair(t, pgtest.Options{Durable: true, Settings: []string{"full_page_writes=off"}})
	ctx := context.Background()
	admin := openPool(t, pair.Primary.DSN("postgres"))
	for _, sql := range []string{"CREATE ROLE watcher LOGIN", "CREATE ROLE nobody LOGIN"} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err)
	}
	require.NoError(t, Migrate(ctx, admin))

	t.Run("Open warns that full_page_writes is off", func(t *testing.T) {
		var logs logBuffer
		_, err := Open(ctx, admin, &Options{Replication: ReplicationAsynchronous, Logger: logs.logger()})
		require.NoError(t, err)
		assert.Contains(t, logs.String(), "full_page_writes is off")
	})
	t.Run("Open refuses an asynchronous standby", func(t *testing.T) {
		_, err := Open(ctx, admin, &Options{Logger: quiet})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "1 standby(s) stream from the database and none is synchronous")
		_, err = Open(ctx, admin, &Options{Replication: ReplicationSynchronous, Logger: quiet})
		require.Error(t, err, "a declared synchronous setup without synchronous_standby_names")
		assert.Contains(t, err.Error(), "synchronous_standby_names is empty")
	})
	t.Run("an operator may accept the risk of an asynchronous standby", func(t *testing.T) {
		_, err := Open(ctx, admin, &Options{Replication: ReplicationAsynchronous, Logger: quiet})
		assert.NoError(t, err)
	})
	t.Run("pg_monitor lets a role see that the standby is asynchronous", func(t *testing.T) {
		_, err := admin.Exec(ctx, "GRANT pg_monitor TO watcher")
		require.NoError(t, err)
		_, err = Open(ctx, openPool(t, asRole(pair.Primary.DSN("postgres"), "watcher")), &Options{Logger: quiet})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "none is synchronous")
	})
	t.Run("a role that cannot tell is warned, naming pg_monitor", func(t *testing.T) {
		var logs logBuffer
		_, err := Open(ctx, openPool(t, asRole(pair.Primary.DSN("postgres"), "nobody")), &Options{Logger: logs.logger()})
		require.NoError(t, err)
		assert.Contains(t, logs.String(), "cannot see whether any is synchronous: grant it pg_monitor")
	})
	t.Run("Open refuses a standby", func(t *testing.T) {
		_, err := Open(ctx, openPool(t, pair.Standby.DSN("postgres")), &Options{Replication: ReplicationAsynchronous})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "is a standby in recovery")
	})

	// A store whose queries reach the standby (after a failover, or
	// through a pooler that sends them to a replica) refuses to decide.
	_, err := admin.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY)")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, post(newOnceServer(admin, payDirect(nil), nil), "paid", `{}`, false).Code)
	standby := openPool(t, pair.Standby.DSN("postgres"))
	require.Eventually(t, func() bool {
		var n int
		err := standby.QueryRow(ctx, "SELECT count(*) FROM idempotency_records WHERE key = 'paid'").Scan(&n)
		return err == nil && n == 1 // the table too is replayed meanwhile
	}, time.Minute, 10*time.Millisecond, "the standby replays the record")
	store := New(standby, nil)
	t.Run("a lookup on the standby is refused, never a miss", func(t *testing.T) {
		for _, key := range []string{"never", "paid"} {
			rec, found, err := store.Get(ctx, idempotency.ID{Key: key}, time.Now())
			require.ErrorIs(t, err, idempotency.ErrUnavailable, "key %s: found %v, %+v", key, found, rec)
			assert.Contains(t, err.Error(), "standby")
		}
	})
	for _, mode := range []struct {
		name string
		h    func(http.Handler) http.Handler
	}{
		{"one transaction", func(h http.Handler) http.Handler {
			return idempotency.New(h, idempotency.Config{Store: store, Principal: anyone, OneTransaction: true})
		}},
		{"lease", func(h http.Handler) http.Handler {
			return idempotency.New(h, idempotency.Config{Store: store, Principal: anyone})
		}},
	} {
		t.Run(mode.name+": a request on the standby is a 503 with Retry-After, and its handler does not run", func(t *testing.T) {
			var ran atomic.Bool
			h := mode.h(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran.Store(true)
				w.WriteHeader(http.StatusCreated)
			}))
			for _, key := range []string{"never", "paid"} {
				w := post(h, key, `{}`, false)
				assert.Equal(t, http.StatusServiceUnavailable, w.Code, "key %s: %s", key, w.Body.String())
				assert.Equal(t, "1", w.Header().Get("Retry-After"), "key %s", key)
				assert.NotContains(t, w.Body.String(), "nothing was done")
			}
			assert.False(t, ran.Load(), "the handler ran on a standby's miss")
		})
	}

	require.NoError(t, pair.MakeSynchronous())
	t.Run("Open accepts a synchronous standby", func(t *testing.T) {
		var logs logBuffer
		_, err := Open(ctx, admin, &Options{Logger: logs.logger()})
		assert.NoError(t, err)
		_, err = Open(ctx, admin, &Options{Replication: ReplicationSynchronous, Logger: logs.logger()})
		assert.NoError(t, err)
		assert.NotContains(t, logs.String(), "standby")
	})

	newAccount(t, admin) // for the inbox's messages
	// The standby receives nothing more: every commit waits for it.
	require.NoError(t, pair.PauseReplication())
	cancelRequest := func(cfg *pgxpool.Config) {
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 30 * time.Second}
		}
	}
	for _, c := range []struct {
		name      string
		configure func(*pgxpool.Config)
		op        func(ctx context.Context, pool *pgxpool.Pool) (done bool, err error)
	}{
		{"an insert, pgx's default closing the connection", func(*pgxpool.Config) {},
			func(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
				_, inserted, err := New(pool, nil).Insert(ctx, inProgress("default", "worker", time.Now()))
				return inserted, err
			}},
		{"an insert, the pool sending a cancel request", cancelRequest,
			func(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
				_, inserted, err := New(pool, nil).Insert(ctx, inProgress("cancel", "worker", time.Now()))
				return inserted, err
			}},
		{"an inbox's message, the pool sending a cancel request", cancelRequest,
			func(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
				var ran atomic.Int32
				return NewInbox(pool).Process(ctx, "consumer", "message", credit(&ran))
			}},
	} {
		// PostgreSQL ends a commit's wait for the standby when the query
		// is canceled, and reports the commit done with a warning, though
		// the standby does not have it.
		t.Run(c.name+" fails when its request ends while the commit waits for the standby", func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(pair.Primary.DSN("postgres"))
			require.NoError(t, err)
			c.configure(cfg)
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			type result struct {
				done bool
				err  error
			}
			waiting := count(t, admin, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
			done := make(chan result, 1)
			go func() {
				ok, err := c.op(rctx, pool)
				done <- result{ok, err}
			}()
			var res result
			require.Eventually(t, func() bool {
				select {
				case res = <-done:
					t.Fatalf("done before it waited for the standby: %v, %v", res.done, res.err)
				default:
				}
				return count(t, admin, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") > waiting
			}, time.Minute, 10*time.Millisecond, "the commit waits for the standby")
			cancel()
			res = <-done
			assert.False(t, res.done, "the request ended while the commit waited for the standby, and the store reports it done")
			assert.ErrorIs(t, res.err, context.Canceled)
		})
	}
}

// TestTerminateBackend: an operator who ends a backend stuck waiting for
// a paused synchronous standby with pg_terminate_backend, as
// docs/SERVER.md says to, ends its connection: the request is never a
// 201, and no handler runs under an IN_PROGRESS record the standby
// lacks. (pg_cancel_backend instead makes PostgreSQL report the commit
// done, with only a warning, which the store cannot see: docs/SERVER.md
// warns against it.)
func TestTerminateBackend(t *testing.T) {
	long.Skip(t, "starts a primary and a synchronous standby and pauses it")
	pair := startPair(t, pgtest.Options{Durable: true})
	require.NoError(t, pair.MakeSynchronous())
	ctx := context.Background()
	admin := openPool(t, pair.Primary.DSN("postgres"))
	require.NoError(t, Migrate(ctx, admin))
	_, err := admin.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY)")
	require.NoError(t, err)
	pool := openPool(t, pair.Primary.DSN("postgres"))
	require.NoError(t, pair.PauseReplication())

	// terminateWaits ends every backend that waits for the standby, as an
	// operator would, until the request answers; it returns the answer.
	terminateWaits := func(t *testing.T, done <-chan int) int {
		t.Helper()
		deadline := time.After(time.Minute)
		ended := 0
		for {
			select {
			case code := <-done:
				require.Positive(t, ended, "the request answered without waiting for the standby")
				return code
			case <-deadline:
				t.Fatal("the request neither answered nor waited for the standby")
			case <-time.After(20 * time.Millisecond):
			}
			ended += count(t, admin, "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep') e")
		}
	}
	t.Run("one transaction: a terminated wait is never a 201", func(t *testing.T) {
		done := make(chan int, 1)
		go func() { done <- post(newOnceServer(pool, payDirect(nil), nil), "once", `{}`, false).Code }()
		code := terminateWaits(t, done)
		assert.Contains(t, []int{http.StatusInternalServerError, http.StatusServiceUnavailable}, code, "a commit the standby does not have")
	})
	t.Run("lease: the handler never runs after a terminated wait for its IN_PROGRESS record", func(t *testing.T) {
		var ran atomic.Bool
		h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Store(true)
			payHandler(w, r)
		}), idempotency.Config{Store: New(pool, nil), Principal: anyone})
		done := make(chan int, 1)
		go func() { done <- post(h, "lease", `{}`, false).Code }()
		code := terminateWaits(t, done)
		assert.False(t, ran.Load(), "the handler ran under a record the standby does not have")
		assert.Contains(t, []int{http.StatusInternalServerError, http.StatusServiceUnavailable}, code, "a commit the standby does not have")
	})
}

// TestCancelBackend: an operator's pg_cancel_backend on a commit that
// waits for a paused synchronous standby. PostgreSQL reports the commit
// done, with only a warning notice, though the standby lacks it: a
// failover would lose it. On a pool prepared by ConfigurePool the store
// sees the warning on its commit's connection, and answers as for a
// commit with no answer: never a 201, and in lease mode the handler
// never runs. Open warns about a pool built without ConfigurePool.
func TestCancelBackend(t *testing.T) {
	long.Skip(t, "starts a primary and a synchronous standby and pauses it")
	pair := startPair(t, pgtest.Options{Durable: true})
	require.NoError(t, pair.MakeSynchronous())
	ctx := context.Background()
	admin := openPool(t, pair.Primary.DSN("postgres"))
	require.NoError(t, Migrate(ctx, admin))
	_, err := admin.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY)")
	require.NoError(t, err)

	t.Run("Open warns about a pool built without ConfigurePool", func(t *testing.T) {
		plain, err := pgxpool.New(ctx, pair.Primary.DSN("postgres"))
		require.NoError(t, err)
		defer plain.Close()
		var logs logBuffer
		_, err = Open(ctx, plain, &Options{Logger: logs.logger()})
		require.NoError(t, err)
		assert.Contains(t, logs.String(), "pgstore.ConfigurePool")
		logs = logBuffer{}
		_, err = Open(ctx, admin, &Options{Logger: logs.logger()})
		require.NoError(t, err)
		assert.NotContains(t, logs.String(), "ConfigurePool")
	})
	t.Run("an operator's OnNotice still gets every notice", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(pair.Primary.DSN("postgres"))
		require.NoError(t, err)
		var seen atomic.Int32
		cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) { seen.Add(1) }
		ConfigurePool(cfg)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		_, err = pool.Exec(ctx, "DO $$BEGIN RAISE WARNING 'hello'; END$$")
		require.NoError(t, err)
		assert.Equal(t, int32(1), seen.Load())
	})

	pool := openPool(t, pair.Primary.DSN("postgres"))
	require.NoError(t, pair.PauseReplication())
	// cancelWaits cancels every backend's wait for the standby, as an
	// operator would, until the request answers; it returns the answer.
	cancelWaits := func(t *testing.T, done <-chan int) int {
		t.Helper()
		deadline := time.After(time.Minute)
		canceled := 0
		for {
			select {
			case code := <-done:
				require.Positive(t, canceled, "the request answered without waiting for the standby")
				return code
			case <-deadline:
				t.Fatal("neither answered nor waited")
			case <-time.After(20 * time.Millisecond):
			}
			canceled += count(t, admin, "SELECT count(*) FROM (SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep') c")
		}
	}
	t.Run("one transaction: a canceled wait is never a 201", func(t *testing.T) {
		done := make(chan int, 1)
		go func() { done <- post(newOnceServer(pool, payDirect(nil), nil), "once", `{}`, false).Code }()
		assert.Equal(t, http.StatusServiceUnavailable, cancelWaits(t, done))
	})
	t.Run("lease: the handler never runs after a canceled wait for its IN_PROGRESS record", func(t *testing.T) {
		var ran atomic.Bool
		h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran.Store(true); payHandler(w, r) }),
			idempotency.Config{Store: New(pool, nil), Principal: anyone})
		done := make(chan int, 1)
		go func() { done <- post(h, "lease", `{}`, false).Code }()
		code := cancelWaits(t, done)
		assert.False(t, ran.Load())
		assert.Equal(t, http.StatusServiceUnavailable, code)
	})
	t.Run("lease: a canceled wait for the COMPLETED record is never a 201", func(t *testing.T) {
		store := New(pool, nil)
		rec := inProgress("complete", "w1", time.Now())
		// The IN_PROGRESS record commits while the standby streams.
		require.NoError(t, pair.ResumeReplication())
		_, inserted, err := store.Insert(ctx, rec)
		require.NoError(t, err)
		require.True(t, inserted)
		require.NoError(t, pair.PauseReplication())
		done := make(chan int, 1)
		go func() {
			err = store.Complete(ctx, rec.ID, "w1", &idempotency.Response{StatusCode: 201}, nil)
			done <- 0
		}()
		cancelWaits(t, done)
		require.ErrorIs(t, err, context.DeadlineExceeded, "a commit the standby may lack is unconfirmed")
		assert.Contains(t, err.Error(), "wait for a synchronous standby was canceled")
	})
	// leaseRecord inserts an IN_PROGRESS record of owner while the
	// standby streams, then pauses it again.
	leaseRecord := func(t *testing.T, store *Store, key, owner string) *idempotency.Record {
		t.Helper()
		rec := inProgress(key, owner, time.Now())
		rec.LockedUntil = rec.CreatedAt // its lease has ended
		require.NoError(t, pair.ResumeReplication())
		_, inserted, err := store.Insert(ctx, rec)
		require.NoError(t, err)
		require.True(t, inserted)
		require.NoError(t, pair.PauseReplication())
		return rec
	}
	t.Run("lease: the handler never runs after a canceled wait for its take-over", func(t *testing.T) {
		store := New(pool, nil)
		rec := leaseRecord(t, store, "take-over", "dead")
		var (
			taken bool
			err   error
		)
		done := make(chan int, 1)
		go func() {
			now := time.Now()
			taken, err = store.TakeOver(ctx, rec.ID, "dead", "alive", now, now.Add(time.Minute))
			done <- 0
		}()
		cancelWaits(t, done)
		assert.False(t, taken, "the handler would run under a take-over the standby may lack")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "wait for a synchronous standby was canceled")
	})
	t.Run("lease: a release whose wait was canceled is unconfirmed", func(t *testing.T) {
		store := New(pool, nil)
		rec := leaseRecord(t, store, "release", "worker")
		var err error
		done := make(chan int, 1)
		go func() {
			err = store.Release(ctx, rec.ID, "worker")
			done <- 0
		}()
		cancelWaits(t, done)
		require.ErrorIs(t, err, context.DeadlineExceeded, "a release the standby may lack")
		assert.Contains(t, err.Error(), "wait for a synchronous standby was canceled")
	})
	t.Run("a mark left by the application's own commit does not fail the store's next one", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(pair.Primary.DSN("postgres"))
		require.NoError(t, err)
		cfg.MaxConns = 1 // the store's commit runs on the marked connection
		ConfigurePool(cfg)
		one, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer one.Close()
		done := make(chan int, 1)
		go func() {
			_, err := one.Exec(ctx, "INSERT INTO payments VALUES ('the app''s')")
			assert.NoError(t, err, "PostgreSQL reports the canceled wait as a commit")
			done <- 0
		}()
		cancelWaits(t, done)
		require.NoError(t, pair.ResumeReplication())
		defer func() { require.NoError(t, pair.PauseReplication()) }()
		_, inserted, err := New(one, nil).Insert(ctx, inProgress("after the app's", "w1", time.Now()))
		require.NoError(t, err, "a commit the standby has")
		assert.True(t, inserted)
	})
	t.Run("inbox: a message whose commit's wait was canceled is not acknowledged", func(t *testing.T) {
		var (
			processed bool
			err       error
		)
		done := make(chan int, 1)
		go func() {
			processed, err = NewInbox(pool).Process(ctx, "consumer", "message", func(context.Context, pgx.Tx) error { return nil })
			done <- 0
		}()
		cancelWaits(t, done)
		assert.False(t, processed)
		require.ErrorIs(t, err, context.DeadlineExceeded, "a message the standby may lack must be delivered again")
	})
}
