package pgstore

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/long"
	"github.com/idemkit/idem/internal/pgtest"
)

// muteProxy forwards TCP connections to a database. Once the client of a
// connection has sent trigger (a statement's text), the database's
// answers on that connection are read and dropped: the statement reached
// the database and ran, and its answer is lost, as when a network or a
// database stops answering after a COMMIT was sent.
type muteProxy struct {
	ln      net.Listener
	target  string
	trigger []byte
	muted   atomic.Int32 // connections whose answers are dropped
	// mutedOpen counts the muted connections that their client has not
	// closed.
	mutedOpen atomic.Int32

	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// containsWord reports whether b holds w followed by a byte that is not a
// letter: COMMIT, not the COMMITTED of BEGIN ISOLATION LEVEL READ
// COMMITTED.
func containsWord(b, w []byte) bool {
	for i := bytes.Index(b, w); i >= 0; {
		if end := i + len(w); end < len(b) && !unicode.IsLetter(rune(b[end])) {
			return true
		}
		j := bytes.Index(b[i+1:], w)
		if j < 0 {
			return false
		}
		i += 1 + j
	}
	return false
}

func newMuteProxy(t *testing.T, target, trigger string) *muteProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &muteProxy{ln: ln, target: target, trigger: []byte(trigger)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *muteProxy) addr() (string, uint16) {
	a := p.ln.Addr().(*net.TCPAddr)
	return a.IP.String(), uint16(a.Port)
}

// Close ends every connection, which ends every wait on them.
func (p *muteProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *muteProxy) keep(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, cs...)
	return true
}

func (p *muteProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil || !p.keep(client, server) {
			_ = client.Close()
			if server != nil {
				_ = server.Close()
			}
			continue
		}
		var mute atomic.Bool
		p.wg.Add(2)
		go func() { // client -> server, watching for the trigger
			defer p.wg.Done()
			defer func() {
				if mute.Load() {
					p.mutedOpen.Add(-1)
				}
			}()
			defer server.Close()
			buf := make([]byte, 32<<10)
			var tail []byte
			for {
				n, err := client.Read(buf)
				if n > 0 {
					// Muted before the trigger goes on: an answer the server
					// sends at once must not slip through.
					seen := append(tail, buf[:n]...)
					if !mute.Load() && containsWord(seen, p.trigger) {
						p.mutedOpen.Add(1)
						mute.Store(true)
						p.muted.Add(1)
					}
					tail = append([]byte(nil), seen[max(0, len(seen)-len(p.trigger)-1):]...)
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server -> client, until muted
			defer p.wg.Done()
			defer client.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && !mute.Load() {
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// proxiedPool is a pool on pool's database through p, in mode.
func proxiedPool(t *testing.T, pool *pgxpool.Pool, p *muteProxy, mode pgx.QueryExecMode) *pgxpool.Pool {
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.addr()
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = 4
	through, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(through.Close)
	return through
}

// target is the host:port of pool's database.
func target(pool *pgxpool.Pool) string {
	c := pool.Config().ConnConfig
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
}

// within runs f and fails t if it has not returned after hang, a bound far
// above what f should take: it detects a wait that never ends, and
// measures nothing. unblock, called then, must make f return.
func within[T any](t *testing.T, hang time.Duration, unblock func(), f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(hang):
		unblock()
		<-done
		t.Fatalf("still waiting after %s: the wait is not bounded", hang)
		panic("unreachable")
	}
}

// hang is how long a bounded wait of a few hundred milliseconds may take
// before the tests call it unbounded: generous, for a loaded machine.
const hang = 5 * time.Second

// bounds are the store's bounds in these tests.
var bounds = &Options{AcquireTimeout: 300 * time.Millisecond, CommitTimeout: 300 * time.Millisecond}

// TestCommitTimeout: the database stops answering once COMMIT was sent
// (the COMMIT runs; its answer is lost). The request ends within
// CommitTimeout with 503 and Retry-After, never the handler's answer;
// the connection is closed, not given back to the pool; closing the pool
// does not hang; and the retry with the key finds what committed, with
// one payment. In the lease mode, an IN_PROGRESS insert whose answer is
// lost never runs the handler.
func TestCommitTimeout(t *testing.T) {
	modes := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement}
	for _, lease := range []bool{false, true} {
		for _, mode := range modes {
			name := "one transaction, " + mode.String()
			if lease {
				name = "lease mode's Complete, " + mode.String()
			}
			t.Run(name, func(t *testing.T) {
				if mode != pgx.QueryExecModeExec {
					long.Skip(t, "the other query modes")
				}
				pool := withPayments(t)
				proxy := newMuteProxy(t, target(pool), "COMMIT")
				through := proxiedPool(t, pool, proxy, mode)
				handler := http.Handler(payDirect(nil))
				if lease {
					handler = http.HandlerFunc(payHandler)
				}
				cfg := idempotency.Config{Store: New(through, bounds), Principal: anyone, OneTransaction: !lease}
				h := idempotency.New(handler, cfg)

				start := time.Now()
				w := within(t, hang, proxy.Close, func() *httptest.ResponseRecorder { return post(h, "k", `{}`, false) })
				t.Logf("answered %d after %s (CommitTimeout %s)", w.Code, time.Since(start).Round(time.Millisecond), bounds.CommitTimeout)
				require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
				assert.Equal(t, "1", w.Header().Get("Retry-After"))
				assert.NotContains(t, w.Body.String(), "paid", "the handler's answer went out for a commit with no answer")
				assert.NotContains(t, w.Body.String(), "nothing was done", "the commit may have happened")
				assert.EqualValues(t, 1, proxy.muted.Load(), "the COMMIT was not sent")

				require.Eventually(t, func() bool { return proxy.mutedOpen.Load() == 0 }, hang, 10*time.Millisecond,
					"the connection whose commit got no answer is still open")
				within(t, hang, proxy.Close, func() struct{} { through.Close(); return struct{}{} })

				// The retry, on a database that answers, finds what the
				// lost COMMIT did: the answer, or nothing (when the COMMIT
				// was parsed before it ran, as with a statement cache).
				cfg.Store = New(pool, nil)
				w = post(idempotency.New(handler, cfg), "k", `{}`, false)
				require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
				t.Logf("the retry: replayed %q", w.Header().Get("Idempotent-Replayed"))
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
			})
		}
	}

	t.Run("lease mode's IN_PROGRESS insert: the handler never runs", func(t *testing.T) {
		pool := withPayments(t)
		proxy := newMuteProxy(t, target(pool), "INSERT INTO idempotency_records")
		through := proxiedPool(t, pool, proxy, pgx.QueryExecModeExec)
		var runs atomic.Int32
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			payHandler(w, r)
		})
		cfg := idempotency.Config{Store: New(through, bounds), Principal: anyone, Lease: time.Minute}
		w := within(t, hang, proxy.Close, func() *httptest.ResponseRecorder {
			return post(idempotency.New(handler, cfg), "k", `{}`, false)
		})
		require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.Zero(t, runs.Load(), "the handler ran after an IN_PROGRESS insert with no answer")
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'IN_PROGRESS'"),
			"the insert did not reach the database")
		within(t, hang, proxy.Close, func() struct{} { through.Close(); return struct{}{} })

		// The record waits for its lease: a retry now is a 409; once the
		// lease has ended (a store whose clock is past it), the retry
		// takes the record over, under its stable id.
		cfg.Store = New(pool, nil)
		assert.Equal(t, http.StatusConflict, post(idempotency.New(handler, cfg), "k", `{}`, false).Code)
		cfg.Store = New(pool, &Options{Clock: clock.NewManual(time.Now().Add(2 * time.Minute))})
		require.Equal(t, http.StatusCreated, post(idempotency.New(handler, cfg), "k", `{}`, false).Code)
		assert.EqualValues(t, 1, runs.Load())
		assert.Equal(t, 1, count(t, pool, `SELECT count(*) FROM idempotency_records r JOIN payments p ON p.id = r.stable_id
			WHERE r.status = 'COMPLETED'`))
	})
}

// TestBehindPgBouncer: the store behind a real PgBouncer in transaction
// pooling with two server connections (default_pool_size=2), in the query
// modes that need no prepared statements. While one slow payment holds a
// server connection, a duplicate of it from another process (another pool)
// gets 409 with Retry-After: the database answers. While two hold both,
// PgBouncer queues every other client: a fresh key gets 503 with
// Retry-After within AcquireTimeout, though the pool gave it a connection
// at once; the duplicate gets 409 or 503 within the same bound; so do a
// lease-mode fresh key and a lookup. Each answer comes while the slow
// payments still hold their connections. Then the slow payments commit,
// and the fresh key pays once.
func TestBehindPgBouncer(t *testing.T) {
	long.Skip(t, "starts PgBouncer")
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := withPayments(t)
			dsn := pgtest.PgBouncer(t, pool.Config().ConnString(), pgtest.PgBouncerOptions{PoolSize: 2})
			bounced := func() *pgxpool.Pool {
				cfg, err := pgxpool.ParseConfig(dsn)
				require.NoError(t, err)
				cfg.ConnConfig.DefaultQueryExecMode = mode
				cfg.MaxConns = 10
				p, err := pgxpool.NewWithConfig(context.Background(), cfg)
				require.NoError(t, err)
				t.Cleanup(p.Close)
				return p
			}
			here, elsewhere := bounced(), bounced() // two processes
			working, release := make(chan struct{}, 2), make(chan struct{})
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			t.Cleanup(unblock)
			slow := payDirect(func() { working <- struct{}{}; <-release })
			server := func(p *pgxpool.Pool, h http.Handler, oneTx bool) http.Handler {
				return idempotency.New(h, idempotency.Config{Store: New(p, bounds), Principal: anyone, OneTransaction: oneTx,
					Expected: 3 * time.Second})
			}
			h, other := server(here, slow, true), server(elsewhere, payDirect(nil), true)

			slowDone := make(chan int, 2)
			go func() { slowDone <- post(h, "slow-1", `{}`, false).Code }()
			<-working
			w := within(t, hang, unblock, func() *httptest.ResponseRecorder { return post(other, "slow-1", `{}`, false) })
			require.Equal(t, http.StatusConflict, w.Code, "a duplicate while a server connection is free: %s", w.Body)
			assert.Equal(t, "3", w.Header().Get("Retry-After"))

			go func() { slowDone <- post(h, "slow-2", `{}`, false).Code }()
			<-working
			// Both server connections are held: PgBouncer queues the rest.
			start := time.Now()
			w = within(t, hang, unblock, func() *httptest.ResponseRecorder { return post(h, "fresh", `{}`, false) })
			t.Logf("a fresh key answered %d after %s (AcquireTimeout %s)", w.Code, time.Since(start).Round(time.Millisecond), bounds.AcquireTimeout)
			require.Equal(t, http.StatusServiceUnavailable, w.Code, "a fresh key behind PgBouncer's queue: %s", w.Body)
			assert.Equal(t, "1", w.Header().Get("Retry-After"))
			w = within(t, hang, unblock, func() *httptest.ResponseRecorder { return post(other, "slow-2", `{}`, false) })
			assert.Contains(t, []int{http.StatusConflict, http.StatusServiceUnavailable}, w.Code, "a duplicate: %s", w.Body)
			assert.NotEmpty(t, w.Header().Get("Retry-After"))
			w = within(t, hang, unblock, func() *httptest.ResponseRecorder {
				return post(server(elsewhere, http.HandlerFunc(payHandler), false), "lease-fresh", `{}`, false)
			})
			assert.Equal(t, http.StatusServiceUnavailable, w.Code, "a lease-mode fresh key: %s", w.Body)
			assert.Equal(t, "1", w.Header().Get("Retry-After"))
			err := within(t, hang, unblock, func() error {
				_, _, err := New(elsewhere, bounds).Get(context.Background(), idempotency.ID{Key: "slow-1"}, time.Now())
				return err
			})
			assert.ErrorIs(t, err, context.DeadlineExceeded, "a lookup behind PgBouncer's queue")
			// The lease mode's other calls are bounded the same way.
			store, id := New(elsewhere, bounds), idempotency.ID{Key: "slow-1"}
			for name, call := range map[string]func() error{
				"TakeOver": func() error {
					now := time.Now()
					_, err := store.TakeOver(context.Background(), id, "a", "b", now, now.Add(time.Minute))
					return err
				},
				"Release": func() error { return store.Release(context.Background(), id, "a") },
				"Complete": func() error {
					return store.Complete(context.Background(), id, "a", &idempotency.Response{StatusCode: 201}, nil)
				},
			} {
				assert.ErrorIs(t, within(t, hang, unblock, call), context.DeadlineExceeded, name)
			}

			unblock()
			assert.Equal(t, http.StatusCreated, <-slowDone)
			assert.Equal(t, http.StatusCreated, <-slowDone)
			// PgBouncer may still be clearing the queued work of the calls
			// that gave up. A client retries a 503 after its Retry-After.
			code := post(h, "fresh", `{}`, false).Code
			for try := 0; code == http.StatusServiceUnavailable && try < 10; try++ {
				time.Sleep(time.Second)
				code = post(h, "fresh", `{}`, false).Code
			}
			assert.Equal(t, http.StatusCreated, code, "the fresh key once PgBouncer has room")
			assert.Equal(t, 3, count(t, pool, "SELECT count(*) FROM payments"))
		})
	}
}
