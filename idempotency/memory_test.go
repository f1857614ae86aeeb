package idempotency_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
)

var t0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func newRecord(owner string, now time.Time) *idempotency.Record {
	return &idempotency.Record{
		ID:     idempotency.ID{Principal: "p", Key: "k"},
		Status: idempotency.StatusInProgress, StableID: "s-" + owner, Owner: owner,
		LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
}

// TestMemoryStore checks the store kept in memory: the store suite and
// the races and bounds only it has.
func TestMemoryStore(t *testing.T) {
	t.Run("passes the store suite", func(t *testing.T) {
		storetest.Run(t, func(*testing.T) storetest.Subject {
			clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			s := &idempotency.MemoryStore{Clock: clk}
			return storetest.Subject{
				Store:  s,
				SetNow: func(t time.Time) { clk.Advance(t.Sub(clk.Now())) },
				AtRest: func(context.Context) (string, error) { return idempotency.MemoryAtRest(s), nil },
			}
		})
	})

	t.Run("one of two racing inserts wins", func(t *testing.T) {
		t.Parallel()
		s := &idempotency.MemoryStore{}
		var wins atomic.Int32
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				_, inserted, err := s.Insert(context.Background(), newRecord(strconv.Itoa(i), t0))
				assert.NoError(t, err)
				if inserted {
					wins.Add(1)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int32(1), wins.Load(), "exactly one insert wins")
	})

	t.Run("one of two racing takeovers wins", func(t *testing.T) {
		t.Parallel()
		s := &idempotency.MemoryStore{}
		ctx := context.Background()
		rec := newRecord("dead", t0)
		_, ok, err := s.Insert(ctx, rec)
		require.NoError(t, err)
		require.True(t, ok)

		ok, err = s.TakeOver(ctx, rec.ID, "dead", "early", t0.Add(time.Second), t0.Add(time.Hour))
		require.NoError(t, err)
		assert.False(t, ok, "the lease is alive")

		later := t0.Add(time.Minute)
		var wins atomic.Int32
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				ok, err := s.TakeOver(ctx, rec.ID, "dead", strconv.Itoa(i), later, later.Add(time.Minute))
				assert.NoError(t, err)
				if ok {
					wins.Add(1)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int32(1), wins.Load(), "exactly one takeover wins")
		assert.ErrorIs(t, s.Complete(ctx, rec.ID, "dead", &idempotency.Response{}, nil), idempotency.ErrNotOwner,
			"the dead worker cannot commit")
	})

	t.Run("Complete runs the commit atomically", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s := &idempotency.MemoryStore{}
		rec := newRecord("w", t0)
		_, _, err := s.Insert(ctx, rec)
		require.NoError(t, err)

		boom := errors.New("boom")
		err = s.Complete(ctx, rec.ID, "w", &idempotency.Response{StatusCode: 201}, func(context.Context) error { return boom })
		require.ErrorIs(t, err, boom)
		existing, _, _ := s.Insert(ctx, newRecord("x", t0))
		assert.Equal(t, idempotency.StatusInProgress, existing.Status, "a failed commit changes nothing")

		ran := false
		require.NoError(t, s.Complete(ctx, rec.ID, "w", &idempotency.Response{StatusCode: 201}, func(context.Context) error { ran = true; return nil }))
		assert.True(t, ran)
		existing, _, _ = s.Insert(ctx, newRecord("x", t0))
		assert.Equal(t, idempotency.StatusCompleted, existing.Status)
		assert.Equal(t, 201, existing.Response.StatusCode)
		assert.ErrorIs(t, s.Release(ctx, rec.ID, "w"), idempotency.ErrNotOwner, "a completed record is not released")
	})

	t.Run("a record expires after its retention", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s := &idempotency.MemoryStore{}
		_, _, err := s.Insert(ctx, newRecord("a", t0))
		require.NoError(t, err)
		_, inserted, _ := s.Insert(ctx, newRecord("b", t0.Add(time.Hour-time.Nanosecond)))
		assert.False(t, inserted)
		n, _ := s.Sweep(ctx, t0.Add(time.Hour-time.Nanosecond))
		assert.Zero(t, n)
		_, inserted, _ = s.Insert(ctx, newRecord("c", t0.Add(time.Hour)))
		assert.True(t, inserted, "an expired record counts as absent")
		n, _ = s.Sweep(ctx, t0.Add(2*time.Hour))
		assert.Equal(t, 1, n)
		records, _, _ := s.Count(ctx)
		assert.Zero(t, records)
	})

	// A full store refuses a new key, saying when the earliest record
	// expires, keeps answering the keys it holds, and makes room from
	// expired records when it needs it.
	t.Run("a full store refuses a new key without storing it", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s := &idempotency.MemoryStore{MaxRecords: 2}
		rec := func(key string, now time.Time) *idempotency.Record {
			r := newRecord("o-"+key, now)
			r.ID.Key = key
			return r
		}
		for _, k := range []string{"a", "b"} {
			_, inserted, err := s.Insert(ctx, rec(k, t0))
			require.NoError(t, err)
			require.True(t, inserted)
		}
		_, inserted, err := s.Insert(ctx, rec("c", t0.Add(time.Minute)))
		assert.False(t, inserted)
		require.ErrorIs(t, err, idempotency.ErrStoreFull)
		var full *idempotency.FullError
		require.ErrorAs(t, err, &full)
		assert.Equal(t, t0.Add(time.Hour), full.Until, "room when the earliest record expires")
		n, _, _ := s.Count(ctx)
		assert.Equal(t, 2, n, "nothing stored")

		existing, inserted, err := s.Insert(ctx, rec("a", t0.Add(time.Minute)))
		require.NoError(t, err, "a held key is still answered")
		assert.False(t, inserted)
		assert.Equal(t, "s-o-a", existing.StableID)

		_, inserted, err = s.Insert(ctx, rec("c", t0.Add(time.Hour)))
		require.NoError(t, err, "expired records make room")
		assert.True(t, inserted)
		n, _, _ = s.Count(ctx)
		assert.Equal(t, 1, n)
	})
}
