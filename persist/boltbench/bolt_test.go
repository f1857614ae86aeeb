package boltbench

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/persist"
)

// TestBoltStore checks that the store the comparison measures keeps the
// rules its figures depend on: a conditional write, and the index of
// unresolved intents that makes its listing quick.
func TestBoltStore(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T) *boltStore {
		s, err := openBolt(filepath.Join(t.TempDir(), "idem.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	unresolved := func(t *testing.T, s *boltStore) int {
		recs, err := s.List(ctx, persist.Filter{Unresolved: true})
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}

	t.Run("a record reads back as written", func(t *testing.T) {
		s := open(t)
		rec := benchRecord(1, true)
		if err := s.Write(ctx, rec, nil); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, rec.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !persist.SameVersion(got, rec) || got.State != rec.State || string(got.Response.Body) != string(rec.Response.Body) {
			t.Fatalf("read back %+v, wrote %+v", got, rec)
		}
		if _, err := s.Get(ctx, "absent"); !errors.Is(err, persist.ErrNotFound) {
			t.Fatalf("Get of an absent key: %v, want ErrNotFound", err)
		}
	})

	t.Run("a write over a version no longer stored changes nothing", func(t *testing.T) {
		s := open(t)
		first := benchRecord(1, false)
		if err := s.Write(ctx, first, nil); err != nil {
			t.Fatal(err)
		}
		var conflict *persist.ConflictError
		if err := s.Write(ctx, benchRecord(1, false), nil); !errors.As(err, &conflict) || !persist.SameVersion(conflict.Current, first) {
			t.Fatalf("second new write of one key: %v, want a conflict holding the first", err)
		}
		second := first.Clone()
		second.Rev, second.Attempts = persist.NewRev(), 2
		if err := s.Write(ctx, second, first); err != nil {
			t.Fatal(err)
		}
		third := first.Clone()
		third.Rev, third.UpdatedAt = persist.NewRev(), first.UpdatedAt.Add(time.Second)
		if err := s.Write(ctx, third, first); !errors.As(err, &conflict) || !persist.SameVersion(conflict.Current, second) {
			t.Fatalf("write over a replaced version: %v, want a conflict holding the stored one", err)
		}
		if err := s.Delete(ctx, first); !errors.As(err, &conflict) {
			t.Fatalf("delete of a replaced version: %v, want a conflict", err)
		}
		if got, err := s.Get(ctx, first.Key); err != nil || !persist.SameVersion(got, second) {
			t.Fatalf("stored %+v (%v), want the second version", got, err)
		}
	})

	t.Run("the unresolved listed follow each write and delete", func(t *testing.T) {
		s := open(t)
		rec := benchRecord(1, false)
		if err := s.Write(ctx, rec, nil); err != nil {
			t.Fatal(err)
		}
		if n := unresolved(t, s); n != 1 {
			t.Fatalf("%d unresolved after a pending write, want 1", n)
		}
		done := benchRecord(1, true)
		if err := s.Write(ctx, done, rec); err != nil {
			t.Fatal(err)
		}
		if n := unresolved(t, s); n != 0 {
			t.Fatalf("%d unresolved after it resolved, want 0", n)
		}
		again := benchRecord(2, false)
		if err := s.Write(ctx, again, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, again); err != nil {
			t.Fatal(err)
		}
		if n := unresolved(t, s); n != 0 {
			t.Fatalf("%d unresolved after the delete, want 0", n)
		}
	})
}
