package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newAccount creates an account table with one balance of 0.
func newAccount(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		"CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL); INSERT INTO accounts VALUES ('a', 0)"); err != nil {
		t.Fatal(err)
	}
}

func balance(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var b int64
	if err := pool.QueryRow(context.Background(), "SELECT balance FROM accounts WHERE id = 'a'").Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// credit is a message's effect: it adds 10 to the balance, through tx.
func credit(ran *atomic.Int32) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		ran.Add(1)
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = 'a'")
		return err
	}
}

// TestInbox checks that a message's effect commits once, with its record,
// however often and however concurrently the message is delivered.
func TestInbox(t *testing.T) {
	t.Run("a message delivered twice at once runs once", func(t *testing.T) {
		pool := newPool(t)
		newAccount(t, pool)
		in := NewInbox(pool)
		var ran, processed atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 20 {
			wg.Go(func() {
				<-start
				ok, err := in.Process(context.Background(), "billing", "msg-1", credit(&ran))
				if err != nil {
					t.Errorf("Process: %v", err)
				}
				if ok {
					processed.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if processed.Load() != 1 || ran.Load() != 1 || balance(t, pool) != 10 {
			t.Errorf("20 deliveries: processed %d, effect ran %d, balance %d; want 1, 1, 10",
				processed.Load(), ran.Load(), balance(t, pool))
		}
		// Another consumer of the same message id processes it too.
		if ok, err := in.Process(context.Background(), "audit", "msg-1", credit(&ran)); err != nil || !ok {
			t.Errorf("Process by another consumer = %v, %v; want true, nil", ok, err)
		}
	})

	// The consumer commits the effect, then dies before acknowledging; the
	// broker delivers the message again, and the redelivery does nothing.
	t.Run("a redelivery after a crash before the ack does nothing", func(t *testing.T) {
		pool := newPool(t)
		newAccount(t, pool)
		in := NewInbox(pool)
		var ran atomic.Int32
		ok, err := in.Process(context.Background(), "billing", "msg-1", credit(&ran))
		if err != nil || !ok {
			t.Fatalf("first delivery: %v, %v", ok, err)
		}
		// (no acknowledgement: the process crashed here)
		ok, err = in.Process(context.Background(), "billing", "msg-1", credit(&ran))
		if err != nil || ok {
			t.Errorf("redelivery = %v, %v; want false, nil", ok, err)
		}
		if ran.Load() != 1 || balance(t, pool) != 10 {
			t.Errorf("effect ran %d times, balance %d; want 1, 10", ran.Load(), balance(t, pool))
		}
	})

	// The connection dies after the effect ran in the transaction and before
	// the commit: nothing is recorded, and the redelivery does the work.
	t.Run("a crash during the effect records nothing", func(t *testing.T) {
		pool := newPool(t)
		newAccount(t, pool)
		in := NewInbox(pool)
		var ran atomic.Int32
		_, err := in.Process(context.Background(), "billing", "msg-1", func(ctx context.Context, tx pgx.Tx) error {
			if err := credit(&ran)(ctx, tx); err != nil {
				return err
			}
			var pid int
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			_, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
			return err
		})
		if err == nil {
			t.Fatal("Process on a lost connection succeeded")
		}
		if balance(t, pool) != 0 {
			t.Fatalf("balance %d after the lost connection, want 0", balance(t, pool))
		}
		ok, err := in.Process(context.Background(), "billing", "msg-1", credit(&ran))
		if err != nil || !ok || balance(t, pool) != 10 {
			t.Errorf("redelivery = %v, %v, balance %d; want true, nil, 10", ok, err, balance(t, pool))
		}
	})

	t.Run("a failed effect records nothing", func(t *testing.T) {
		pool := newPool(t)
		newAccount(t, pool)
		in := NewInbox(pool)
		boom := errors.New("boom")
		var ran atomic.Int32
		_, err := in.Process(context.Background(), "billing", "msg-1", func(ctx context.Context, tx pgx.Tx) error {
			_ = credit(&ran)(ctx, tx)
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Process = %v, want the effect's error", err)
		}
		ok, err := in.Process(context.Background(), "billing", "msg-1", credit(&ran))
		if err != nil || !ok || balance(t, pool) != 10 {
			t.Errorf("redelivery = %v, %v, balance %d; want true, nil, 10", ok, err, balance(t, pool))
		}
	})

	t.Run("the sweep forgets old messages", func(t *testing.T) {
		pool := newPool(t)
		in := NewInbox(pool)
		in.batch = 3
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `INSERT INTO idempotency_inbox (consumer, message_id, processed_at)
		SELECT 'c', 'old-' || i, now() - interval '2 days' FROM generate_series(1, 7) AS i`); err != nil {
			t.Fatal(err)
		}
		noop := func(context.Context, pgx.Tx) error { return nil }
		if _, err := in.Process(ctx, "c", "new", noop); err != nil {
			t.Fatal(err)
		}
		n, err := in.Sweep(ctx, 24*time.Hour)
		if err != nil || n != 7 {
			t.Fatalf("Sweep = %d, %v; want 7, nil", n, err)
		}
		if ok, err := in.Process(ctx, "c", "new", noop); err != nil || ok {
			t.Errorf("the recent message was forgotten: Process = %v, %v", ok, err)
		}
		if ok, err := in.Process(ctx, "c", "old-1", noop); err != nil || !ok {
			t.Errorf("a swept message: Process = %v, %v; want true", ok, err)
		}
	})

	// The inbox sweep's batch statement reads the inbox through the
	// processed_at index, and nowhere reads the whole table, after ANALYZE,
	// whether few or most messages are old (see TestSweep/walks the
	// expires_at index).
	t.Run("the sweep walks the processed_at index", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			old  int // messages in a hundred processed two days ago
		}{
			{"a few old messages among recent ones", 1},
			{"a sweep that fell behind: most messages old", 90},
		} {
			t.Run(tc.name, func(t *testing.T) {
				pool := newPool(t)
				ctx := context.Background()
				if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO idempotency_inbox (consumer, message_id, processed_at)
				SELECT 'c' || (i %% 7), 'm' || i, now() - CASE WHEN i %% 100 < %d THEN interval '2 days' ELSE interval '1 minute' END
				FROM generate_series(1, %d) AS i`, tc.old, sweepTableRows)); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, "ANALYZE idempotency_inbox"); err != nil {
					t.Fatal(err)
				}
				for _, plan := range plansOf(t, pool, inboxSweepSQL, "interval, timestamptz, integer", "'1 day', NULL, 1000") {
					t.Run("the "+plan.mode+" plan walks the index", func(t *testing.T) {
						plan.readsOnly(t, "idempotency_inbox", "idempotency_inbox_processed_at")
					})
				}
			})
		}
	})
}
