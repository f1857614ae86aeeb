package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/pgtest"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func inProgress(key, owner string, now time.Time) *idempotency.Record {
	return &idempotency.Record{
		ID: idempotency.ID{Principal: "secret-token", Key: key}, Status: idempotency.StatusInProgress,
		StableID: "stable", Owner: owner, LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
}

// sweepCounts is a pgx tracer that counts the records in the table as
// each sweep statement starts, through a pool of its own.
type sweepCounts struct {
	mu     sync.Mutex
	pool   *pgxpool.Pool
	counts []int
}

func (c *sweepCounts) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if data.SQL == sweepSQL {
		var n int
		if err := c.pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_records").Scan(&n); err != nil {
			n = -1
		}
		c.mu.Lock()
		c.counts = append(c.counts, n)
		c.mu.Unlock()
	}
	return ctx
}

func (c *sweepCounts) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// batches is how many records each sweep statement deleted, given the
// records left after the last.
func (c *sweepCounts) batches(left int) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, n := range c.counts {
		next := left
		if i+1 < len(c.counts) {
			next = c.counts[i+1]
		}
		out = append(out, n-next)
	}
	return out
}

// TestStore checks what the store's errors and columns show.
func TestStore(t *testing.T) {
	t.Run("errors say what was being done", func(t *testing.T) {
		pool := newPool(t)
		s := New(pool, nil)
		ctx := context.Background()
		if _, err := pool.Exec(ctx, "DROP TABLE idempotency_records"); err != nil {
			t.Fatal(err)
		}
		rec := inProgress("k", "w", t0)
		_, _, insertErr := s.Insert(ctx, rec)
		_, takeOverErr := s.TakeOver(ctx, rec.ID, "a", "b", t0, t0)
		_, sweepErr := s.Sweep(ctx, t0)
		for _, c := range []struct {
			err  error
			want string
		}{
			{insertErr, `pgstore: insert key "k": `},
			{takeOverErr, `pgstore: take over key "k": `},
			{s.Complete(ctx, rec.ID, "w", nil, nil), `pgstore: complete key "k": lock the record: `},
			{s.Release(ctx, rec.ID, "w"), `pgstore: release key "k": `},
			{sweepErr, `pgstore: sweep expired records (0 deleted so far): `},
		} {
			var pgErr *pgconn.PgError
			if c.err == nil || !strings.HasPrefix(c.err.Error(), c.want) || !errors.As(c.err, &pgErr) || pgErr.Code != "42P01" {
				t.Errorf("error %v; want it to start %q and wrap the undefined_table error", c.err, c.want)
			}
		}
	})

	// Behind a server whose Principal is the credential itself, SELECT
	// caller FROM idempotency_records shows digests only, for an API key and
	// for a 3,000-character token (which also pays: its digest fits the
	// primary key's btree, the token would not), and no column of any record
	// holds the credential.
	t.Run("the caller column never shows the credential", func(t *testing.T) {
		pool := newPool(t)
		ctx := context.Background()
		h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }),
			idempotency.Config{Store: New(pool, nil), Principal: func(r *http.Request) string { return r.Header.Get("Authorization") }})
		long := "Bearer sk_live_" + pgtest.RandomToken(3000)
		for _, auth := range []string{"Bearer sk_live_51HzQ2eLkdIwHu7ix0Ff3", long} {
			for attempt := range 2 {
				r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
				r.Header.Set("Idempotency-Key", "k1")
				r.Header.Set("Authorization", auth)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated || (attempt == 1) != (w.Header().Get("Idempotent-Replayed") == "true") {
					t.Fatalf("attempt %d with a %d-character credential: %d %q %s; want 201, replayed on the retry",
						attempt+1, len(auth), w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
				}
			}
		}
		rows, err := pool.Query(ctx, "SELECT caller FROM idempotency_records")
		if err != nil {
			t.Fatal(err)
		}
		callers, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(callers) != 2 {
			t.Fatalf("%d records, want 2", len(callers))
		}
		for _, c := range callers {
			if strings.Contains(c, "sk_live") || len(c) != 64 {
				t.Errorf("caller column %.80q is not a digest", c)
			}
		}
		// Nor does any other column, in text or bytes: the stored answer, its
		// headers, the fingerprint.
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_records r WHERE strpos(r::text, 'sk_live') > 0 OR strpos(r::text, encode('sk_live', 'hex')) > 0`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d records hold the credential in some column", n)
		}
	})
}

// TestLeaseEffect checks the transaction Complete gives the lease mode's
// effect: it commits with the record, or neither commits.
func TestLeaseEffect(t *testing.T) {
	// In the lease mode, an effect (the function given to
	// idempotency.OnCommit) that ends the transaction Complete gave it
	// (Commit or Rollback on it, or COMMIT or ROLLBACK as SQL through it),
	// then reports success, fails its request with a 500 problem with no
	// internal text, and no answer is stored: the record stays IN_PROGRESS
	// with its lease ended at once, never COMPLETED for an effect that did
	// not commit with it. The retry with the key takes the record over and
	// does the work exactly once; only a COMMIT sent as SQL committed the
	// effect's earlier writes on their own, which the retry then does again.
	t.Run("an effect that ends its transaction fails its request", func(t *testing.T) {
		for _, tc := range transactionEndings {
			t.Run(tc.name, func(t *testing.T) {
				pool := withPayments(t)
				var ended error
				h := idempotency.New(onCommit(func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ('p1')"); err != nil {
						return err
					}
					ended = tc.end(ctx, tx)
					return nil // and the end's error is ignored: the effect reports success
				}), idempotency.Config{Store: New(pool, nil), Principal: anyone})
				w := post(h, "k", `{}`, false)
				t.Logf("ending the transaction returned %v", ended)
				requireEndingFailed(t, pool, w, tc.committed)
				assert.Zero(t, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED'"), "an answer was stored")
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'IN_PROGRESS' AND owner = ''"),
					"the record is not IN_PROGRESS with its lease given up")

				// The retry takes the record over and does the work, with an
				// effect that keeps the rule; a second retry replays it.
				h = idempotency.New(http.HandlerFunc(payHandler), idempotency.Config{Store: New(pool, nil), Principal: anyone})
				require.Equal(t, http.StatusCreated, post(h, "k", `{}`, false).Code)
				w = post(h, "k", `{}`, false)
				require.Equal(t, http.StatusCreated, w.Code)
				assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
				assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments"))
				assert.Equal(t, 1, count(t, pool, `SELECT count(*) FROM idempotency_records r JOIN payments p ON p.id = r.stable_id
				WHERE r.status = 'COMPLETED'`), "the retry did not complete the record under its stable id")
			})
		}
	})

	// The effect of the lease mode nests transactions as savepoints
	// (pgx.BeginFunc) on the transaction Complete gave it: a nested one that
	// fails is undone alone, one that succeeds commits with the record.
	t.Run("nested transactions are savepoints", func(t *testing.T) {
		pool := withPayments(t)
		h := idempotency.New(onCommit(func(ctx context.Context, tx pgx.Tx) error {
			if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				_, err := sp.Exec(ctx, "INSERT INTO payments (id) VALUES ('kept')")
				return err
			}); err != nil {
				return err
			}
			undone := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				if _, err := sp.Exec(ctx, "INSERT INTO payments (id) VALUES ('undone')"); err != nil {
					return err
				}
				return errors.New("changed its mind")
			})
			if undone == nil {
				return errors.New("the failing savepoint succeeded")
			}
			return nil
		}), idempotency.Config{Store: New(pool, nil), Principal: anyone})
		w := post(h, "k", `{}`, false)
		require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM payments WHERE id = 'kept'"))
		assert.Zero(t, count(t, pool, "SELECT count(*) FROM payments WHERE id = 'undone'"))
		assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE status = 'COMPLETED'"))
	})

	// The transaction Complete gave the effect, and a savepoint of it,
	// refuse every use once Complete has returned (pgx.ErrTxClosed, as pgx's
	// own transactions do). An effect that kept them (a goroutine it
	// started, a struct it filled) would otherwise write through a
	// connection that is back in the pool: on its own, committed without any
	// record, or inside the transaction of whichever request holds the
	// connection now.
	t.Run("the transaction is refused once Complete returned", func(t *testing.T) {
		// One connection: the next user gets the one the effect had.
		pool := newPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
		ctx := context.Background()
		_, err := pool.Exec(ctx, "CREATE TABLE business_rows (name text PRIMARY KEY)")
		require.NoError(t, err)
		s := New(pool, nil)
		rec := inProgress("k", "w1", t0)
		_, ok, err := s.Insert(ctx, rec)
		require.True(t, ok)
		require.NoError(t, err)

		var kept, keptSavepoint pgx.Tx
		require.NoError(t, s.Complete(ctx, rec.ID, "w1", &idempotency.Response{StatusCode: 201}, func(ctx context.Context) error {
			kept, _ = Tx(ctx)
			var err error
			keptSavepoint, err = kept.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = kept.Exec(ctx, "INSERT INTO business_rows VALUES ('charged')")
			return err
		}))

		// Another request now holds the connection, in a transaction.
		other, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = kept.Exec(ctx, "INSERT INTO business_rows VALUES ('late')")
		assert.ErrorIs(t, err, pgx.ErrTxClosed, "Exec")
		_, err = keptSavepoint.Exec(ctx, "INSERT INTO business_rows VALUES ('late savepoint')")
		assert.ErrorIs(t, err, pgx.ErrTxClosed, "savepoint's Exec")
		var one int
		assert.ErrorIs(t, kept.QueryRow(ctx, "SELECT 1").Scan(&one), pgx.ErrTxClosed, "QueryRow")
		rows, err := kept.Query(ctx, "SELECT 1")
		assert.ErrorIs(t, err, pgx.ErrTxClosed, "Query")
		rows.Close()
		b := &pgx.Batch{}
		b.Queue("INSERT INTO business_rows VALUES ('late batch')")
		assert.ErrorIs(t, kept.SendBatch(ctx, b).Close(), pgx.ErrTxClosed, "SendBatch")
		_, err = kept.Begin(ctx)
		assert.ErrorIs(t, err, pgx.ErrTxClosed, "Begin")
		assert.ErrorIs(t, keptSavepoint.Rollback(ctx), pgx.ErrTxClosed, "savepoint's Rollback")
		require.NoError(t, other.Commit(ctx))

		rows, err = pool.Query(ctx, "SELECT name FROM business_rows ORDER BY name")
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		assert.Equal(t, []string{"charged"}, names, "writes through the effect's transaction after Complete returned")
	})

	// A connection lost in the middle of Complete, after the record was marked
	// COMPLETED in the transaction and the effect ran, leaves the record
	// IN_PROGRESS and its owner's; the owner can complete it later.
	t.Run("a connection lost in Complete leaves the record in progress", func(t *testing.T) {
		pool := newPool(t)
		s := New(pool, nil)
		ctx := context.Background()
		if _, err := pool.Exec(ctx, "CREATE TABLE business_rows (name text PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		rec := inProgress("k", "w1", t0)
		if _, ok, err := s.Insert(ctx, rec); err != nil || !ok {
			t.Fatalf("Insert = %v, %v", ok, err)
		}
		err := s.Complete(ctx, rec.ID, "w1", &idempotency.Response{StatusCode: 201}, func(ctx context.Context) error {
			tx, _ := Tx(ctx)
			if _, err := tx.Exec(ctx, "INSERT INTO business_rows VALUES ('charged')"); err != nil {
				return err
			}
			// The server ends this session, as a network failure or a
			// restarted database would.
			var pid int
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			_, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
			return err
		})
		if err == nil {
			t.Fatal("Complete on a lost connection succeeded")
		}
		if !strings.Contains(err.Error(), `pgstore: complete key "k": commit`) {
			t.Errorf("error %q does not say what was being done", err)
		}
		if strings.Contains(err.Error(), "secret-token") {
			t.Errorf("error %q names the caller", err)
		}
		got, found, err := s.Get(ctx, rec.ID, t0)
		if err != nil || !found || got.Status != idempotency.StatusInProgress || got.Owner != "w1" {
			t.Fatalf("after the lost connection: record %+v, %v, %v; want IN_PROGRESS owned by w1", got, found, err)
		}
		var rows int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM business_rows").Scan(&rows); err != nil || rows != 0 {
			t.Errorf("business rows = %d, %v; want 0", rows, err)
		}
		if err := s.Complete(ctx, rec.ID, "w1", &idempotency.Response{StatusCode: 201}, nil); err != nil {
			t.Errorf("Complete on a new connection: %v", err)
		}
	})
}

// TestDefaultIsolation: a database (or role) whose
// default_transaction_isolation is repeatable read or serializable takes
// a transaction's snapshot at its first statement. Get tries the key's
// lock, then reads the record: a snapshot taken before the lock would
// miss a record that RunOnce committed just before releasing it, and the
// lookup would answer "nothing was done" for a key that exists. So once
// Get has seen the key held, it never reads it as absent.
func TestDefaultIsolation(t *testing.T) {
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level+": a lookup never misses a key it saw held", func(t *testing.T) {
			pool := newPool(t, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			})
			store := New(pool, nil)
			ctx := context.Background()
			misses := 0
			for i := range 300 {
				id := idempotency.ID{Key: fmt.Sprintf("key-%d", i)}
				now := time.Now()
				rec := &idempotency.Record{ID: id, Status: idempotency.StatusInProgress, StableID: "s", Owner: "o",
					LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
				held := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					_, err := store.RunOnce(ctx, rec, func(context.Context, *idempotency.Record) (*idempotency.Response, error) {
						close(held)
						time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
						return &idempotency.Response{StatusCode: 201}, nil
					})
					done <- err
				}()
				<-held
				for {
					got, found, err := store.Get(ctx, id, time.Now())
					require.NoError(t, err)
					if !found {
						misses++
						break
					}
					if got.Status == idempotency.StatusCompleted {
						break
					}
				}
				require.NoError(t, <-done)
			}
			assert.Zero(t, misses, "lookups that read a held key, then missed it as it committed")
		})
		// Under repeatable read or serializable, a duplicate whose snapshot
		// was taken before the key's first request committed does not see
		// its record: its handler runs, and its own record's insert fails
		// on the key's unique index or a serialization failure, which
		// rolls the work back. The record that committed answers it, or it
		// is told to retry (ErrUnavailable: the middleware's 503) and the
		// retry finds the record. It never commits the work twice and
		// never fails otherwise (a 500).
		t.Run(level+": a duplicate never commits a key's work twice, and is told to retry", func(t *testing.T) {
			pool := newPool(t, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			})
			store := New(pool, nil)
			ctx := context.Background()
			twice, failed, retried := 0, 0, 0
			for i := range 300 {
				id := idempotency.ID{Key: fmt.Sprintf("key-%d", i)}
				now := time.Now()
				rec := &idempotency.Record{ID: id, Status: idempotency.StatusInProgress, StableID: "s", Owner: "o",
					LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
				held := make(chan struct{})
				done := make(chan error, 1)
				work := func(context.Context, *idempotency.Record) (*idempotency.Response, error) {
					return &idempotency.Response{StatusCode: 201}, nil
				}
				go func() {
					_, err := store.RunOnce(ctx, rec, func(ctx context.Context, a *idempotency.Record) (*idempotency.Response, error) {
						close(held)
						time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
						return work(ctx, a)
					})
					done <- err
				}()
				<-held
				for {
					ran := false
					dup := *rec
					got, err := store.RunOnce(ctx, &dup, func(ctx context.Context, a *idempotency.Record) (*idempotency.Response, error) {
						ran = true
						return work(ctx, a)
					})
					if errors.Is(err, idempotency.ErrUnavailable) {
						retried++
						continue // as a client told 503 does
					}
					if err != nil {
						failed++
						break
					}
					if ran && got == nil {
						// The duplicate's own work committed. (A handler
						// that ran and then found the record rolled back:
						// the record answers, got.)
						twice++
					}
					if got == nil || got.Status == idempotency.StatusCompleted {
						break
					}
				}
				require.NoError(t, <-done)
			}
			t.Logf("%s: %d of 300 duplicates were told to retry", level, retried)
			assert.Zero(t, twice, "duplicates that committed the work of a key held by another")
			assert.Zero(t, failed, "duplicates that failed instead of finding the record or being told to retry")
		})
		// A take-over committed while Complete waits for the record's row
		// fails Complete's lock with a serialization failure under
		// repeatable read or serializable: the worker is told to retry,
		// or (under read committed) that the record is no longer its.
		t.Run(level+": a worker whose record was taken over while it completed is told so or told to retry", func(t *testing.T) {
			pool := newPool(t, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			})
			store := New(pool, nil)
			ctx := context.Background()
			rec := inProgress("taken", "w1", time.Now())
			_, inserted, err := store.Insert(ctx, rec)
			require.NoError(t, err)
			require.True(t, inserted)
			// Another worker's take-over holds the row while Complete
			// begins, and commits while Complete waits for it.
			other, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = other.Rollback(ctx) }()
			_, err = other.Exec(ctx, "UPDATE idempotency_records SET owner = 'w2' WHERE key = 'taken'")
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { done <- store.Complete(ctx, rec.ID, "w1", &idempotency.Response{StatusCode: 201}, nil) }()
			require.Eventually(t, func() bool {
				return count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'") > 0
			}, time.Minute, 5*time.Millisecond, "Complete waits for the row")
			require.NoError(t, other.Commit(ctx))
			err = <-done
			assert.True(t, errors.Is(err, idempotency.ErrNotOwner) || errors.Is(err, idempotency.ErrUnavailable), "%v", err)
			assert.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idempotency_records WHERE key = 'taken' AND status = 'IN_PROGRESS' AND owner = 'w2'"))
		})
	}
}
