package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// txChecks are the checks of a store that is an [idempotency.TxStore]
// (the single-transaction mode); other stores skip them.
var txChecks = []struct {
	name string
	fn   func(*testing.T, Subject, idempotency.TxStore)
}{
	{"RunOnceCommitsOnce", testRunOnceCommitsOnce},
	{"RunOnceRollsBack", testRunOnceRollsBack},
	{"RunOnceHoldsTheKey", testRunOnceHoldsTheKey},
	{"RunOnceRace", testRunOnceRace},
	{"RunOnceAndLeaseRecords", testRunOnceAndLeaseRecords},
	{"RunOnceYieldsToALeaseRecord", testRunOnceYieldsToALeaseRecord},
	{"RunOnceTakesOverAnEndedLease", testRunOnceTakesOverAnEndedLease},
}

// completed is the answer the checks store.
var completed = &idempotency.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/payments/p1"}}, Body: []byte("paid\n")}

// effect returns a do for RunOnce that writes row name and answers resp.
func effect(sub Subject, name string, resp *idempotency.Response) func(context.Context, *idempotency.Record) (*idempotency.Response, error) {
	return func(ctx context.Context, _ *idempotency.Record) (*idempotency.Response, error) {
		if sub.WriteRow != nil {
			if err := sub.WriteRow(ctx, name); err != nil {
				return nil, err
			}
		}
		return resp, nil
	}
}

func get(t *testing.T, s idempotency.TxStore, id idempotency.ID, now time.Time) *idempotency.Record {
	t.Helper()
	rec, found, err := s.Get(context.Background(), id, now)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !found {
		return nil
	}
	return rec
}

func testRunOnceCommitsOnce(t *testing.T, sub Subject, s idempotency.TxStore) {
	ctx := context.Background()
	sub.SetNow(t0)
	rec := record(key, "w1", t0)
	existing, err := s.RunOnce(ctx, rec, effect(sub, "row-1", completed))
	if err != nil || existing != nil {
		t.Fatalf("RunOnce of a fresh key = %+v, %v; want nil, nil", existing, err)
	}
	got := get(t, s, key, t0)
	if got == nil || got.Status != idempotency.StatusCompleted || got.StableID != rec.StableID || got.Fingerprint != rec.Fingerprint ||
		got.FingerprintVersion != rec.FingerprintVersion || got.Response == nil || got.Response.StatusCode != 201 ||
		string(got.Response.Body) != "paid\n" || fmt.Sprint(got.Response.Header) != fmt.Sprint(completed.Header) {
		t.Fatalf("record after RunOnce = %+v, want COMPLETED with the answer", got)
	}
	if !got.ExpiresAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("expires at %v, want %v (the retention from the store's now)", got.ExpiresAt, t0.Add(time.Hour))
	}
	hasRow(t, sub, "row-1", true)

	ran := false
	existing, err = s.RunOnce(ctx, record(key, "w2", t0), func(context.Context, *idempotency.Record) (*idempotency.Response, error) {
		ran = true
		return completed, nil
	})
	if err != nil || existing == nil || existing.Status != idempotency.StatusCompleted || existing.StableID != rec.StableID {
		t.Errorf("RunOnce of a completed key = %+v, %v; want its record", existing, err)
	}
	if ran {
		t.Error("RunOnce ran the work of a completed key again")
	}
}

func testRunOnceRollsBack(t *testing.T, sub Subject, s idempotency.TxStore) {
	ctx := context.Background()
	sub.SetNow(t0)
	_, err := s.RunOnce(ctx, record(key, "w1", t0), func(ctx context.Context, _ *idempotency.Record) (*idempotency.Response, error) {
		if _, err := effect(sub, "half-done", completed)(ctx, nil); err != nil {
			return nil, err
		}
		return nil, errEffect
	})
	if !errors.Is(err, errEffect) {
		t.Fatalf("RunOnce whose work fails = %v, want its error", err)
	}
	hasRow(t, sub, "half-done", false)
	if got := get(t, s, key, t0); got != nil {
		t.Errorf("a failed RunOnce left a record: %+v", got)
	}

	// A nil answer (a server error) stores nothing either.
	existing, err := s.RunOnce(ctx, record(key, "w2", t0), effect(sub, "server-error", nil))
	if err != nil || existing != nil {
		t.Fatalf("RunOnce answering nil = %+v, %v; want nil, nil", existing, err)
	}
	hasRow(t, sub, "server-error", false)
	if got := get(t, s, key, t0); got != nil {
		t.Errorf("a RunOnce with no answer left a record: %+v", got)
	}

	// The key is free again.
	if existing, err := s.RunOnce(ctx, record(key, "w3", t0), effect(sub, "done", completed)); err != nil || existing != nil {
		t.Fatalf("RunOnce after the failures = %+v, %v", existing, err)
	}
	hasRow(t, sub, "done", true)
}

// testRunOnceHoldsTheKey: while a RunOnce works, another RunOnce of the
// key returns at once without running its work, and Get reads the key as
// IN_PROGRESS; the first then commits.
func testRunOnceHoldsTheKey(t *testing.T, sub Subject, s idempotency.TxStore) {
	ctx := context.Background()
	sub.SetNow(t0)
	working, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		existing, err := s.RunOnce(ctx, record(key, "w1", t0), func(ctx context.Context, _ *idempotency.Record) (*idempotency.Response, error) {
			resp, err := effect(sub, "first", completed)(ctx, nil)
			close(working)
			<-finish
			return resp, err
		})
		if err == nil && existing != nil {
			err = fmt.Errorf("the first RunOnce found %+v", existing)
		}
		first <- err
	}()
	<-working
	ran := false
	existing, err := s.RunOnce(ctx, record(key, "w2", t0), func(context.Context, *idempotency.Record) (*idempotency.Response, error) {
		ran = true
		return completed, nil
	})
	if err != nil || existing == nil || existing.Status != idempotency.StatusInProgress || ran {
		t.Errorf("RunOnce while another works the key = %+v, %v, ran %v; want an IN_PROGRESS record, not run", existing, err, ran)
	}
	if got := get(t, s, key, t0); got == nil || got.Status != idempotency.StatusInProgress {
		t.Errorf("Get while RunOnce works the key = %+v; want IN_PROGRESS", got)
	}
	close(finish)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, key, t0); got == nil || got.Status != idempotency.StatusCompleted {
		t.Errorf("Get after the work = %+v; want COMPLETED", got)
	}
	hasRow(t, sub, "first", true)
}

// testRunOnceRace: of 20 concurrent RunOnce calls on one key, one commits
// its work; the others return the key's record (in progress or completed).
func testRunOnceRace(t *testing.T, sub Subject, s idempotency.TxStore) {
	ctx := context.Background()
	sub.SetNow(t0)
	const n = 20
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		committed []int
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			existing, err := s.RunOnce(ctx, record(key, fmt.Sprint("w", i), t0), effect(sub, fmt.Sprint("race-", i), completed))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("RunOnce %d: %v", i, err)
			case existing == nil:
				committed = append(committed, i)
			case existing.Status != idempotency.StatusInProgress && existing.Status != idempotency.StatusCompleted:
				t.Errorf("RunOnce %d found %+v", i, existing)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(committed) != 1 {
		t.Fatalf("%d RunOnce calls committed (%v), want 1", len(committed), committed)
	}
	for i := range n {
		hasRow(t, sub, fmt.Sprint("race-", i), i == committed[0])
	}
}

// testRunOnceAndLeaseRecords: a live IN_PROGRESS record of the lease mode
// is returned, not worked; an expired record is replaced.
func testRunOnceAndLeaseRecords(t *testing.T, sub Subject, s idempotency.TxStore) {
	ctx := context.Background()
	lease := record(key, "lease", t0)
	mustInsert(t, sub, lease)
	now := t0.Add(10 * time.Second) // the lease lives
	sub.SetNow(now)
	existing, err := s.RunOnce(ctx, record(key, "w1", now.Add(-time.Hour)), effect(sub, "over-lease", completed))
	if err != nil || existing == nil || existing.Owner != "lease" {
		t.Fatalf("RunOnce over a live lease = %+v, %v; want the lease's record", existing, err)
	}
	if !existing.ReadAt.Equal(now) {
		t.Errorf("RunOnce's record has ReadAt %v; want the store's now, %v, whatever its caller's clock", existing.ReadAt, now)
	}
	if got := get(t, s, key, now.Add(-time.Hour)); got == nil || !got.ReadAt.Equal(now) {
		t.Errorf("Get = %+v; want the record with the store's now, %v, as ReadAt", got, now)
	}
	hasRow(t, sub, "over-lease", false)

	later := t0.Add(2 * time.Hour) // past the record's retention and lease
	sub.SetNow(later)
	if existing, err := s.RunOnce(ctx, record(key, "w2", later), effect(sub, "replaced", completed)); err != nil || existing != nil {
		t.Fatalf("RunOnce over an expired record = %+v, %v; want nil, nil", existing, err)
	}
	if got := get(t, s, key, later); got == nil || got.Status != idempotency.StatusCompleted || got.StableID != "stable-w2" {
		t.Errorf("record after replacing an expired one = %+v", got)
	}
	hasRow(t, sub, "replaced", true)
}

// testRunOnceYieldsToALeaseRecord: a lease-mode worker, which takes no
// lock, inserts the key's record while RunOnce works it: the work rolls
// back and RunOnce returns that record.
func testRunOnceYieldsToALeaseRecord(t *testing.T, sub Subject, s idempotency.TxStore) {
	ctx := context.Background()
	sub.SetNow(t0)
	existing, err := s.RunOnce(ctx, record(key, "w1", t0), func(ctx context.Context, _ *idempotency.Record) (*idempotency.Response, error) {
		if _, inserted, err := s.Insert(context.Background(), record(key, "lease", t0)); err != nil || !inserted {
			return nil, fmt.Errorf("the lease-mode insert: %v, %v", inserted, err)
		}
		return effect(sub, "yielded", completed)(ctx, nil)
	})
	if err != nil || existing == nil || existing.Owner != "lease" {
		t.Errorf("RunOnce when a lease record appeared = %+v, %v; want that record", existing, err)
	}
	hasRow(t, sub, "yielded", false)
	if got := get(t, s, key, t0); got == nil || got.Owner != "lease" || got.Status != idempotency.StatusInProgress {
		t.Errorf("record = %+v, want the lease's", got)
	}
}

// testRunOnceTakesOverAnEndedLease: a lease-mode record whose lease has
// ended (its retention has not) is taken over by a RunOnce of the same
// content, in its transaction: do gets the record, and the COMPLETED
// record keeps its stable id; the old worker can no longer complete it. A
// RunOnce of other content gets the record, without running. A RunOnce
// whose work fails leaves the record as it was, for the next.
func testRunOnceTakesOverAnEndedLease(t *testing.T, sub Subject, s idempotency.TxStore) {
	ctx := context.Background()
	lease := record(key, "lease", t0)
	mustInsert(t, sub, lease)
	later := t0.Add(2 * time.Minute) // past the lease, within the retention
	sub.SetNow(later)

	other := record(key, "other", later)
	other.Fingerprint = fingerprint("another body")
	ran := false
	existing, err := s.RunOnce(ctx, other, func(context.Context, *idempotency.Record) (*idempotency.Response, error) {
		ran = true
		return completed, nil
	})
	if err != nil || existing == nil || existing.Owner != "lease" || ran {
		t.Errorf("RunOnce of other content over an ended lease = %+v, %v, ran %v; want the lease's record, not run", existing, err, ran)
	}

	_, err = s.RunOnce(ctx, record(key, "failing", later), func(ctx context.Context, abandoned *idempotency.Record) (*idempotency.Response, error) {
		if _, err := effect(sub, "failed", completed)(ctx, abandoned); err != nil {
			return nil, err
		}
		return nil, errEffect
	})
	if !errors.Is(err, errEffect) {
		t.Fatalf("RunOnce whose work fails over an ended lease = %v, want its error", err)
	}
	hasRow(t, sub, "failed", false)
	if got := get(t, s, key, later); got == nil || got.Owner != "lease" || got.Status != idempotency.StatusInProgress {
		t.Errorf("record after a failed take-over = %+v, want the lease's as it was", got)
	}

	var got *idempotency.Record
	existing, err = s.RunOnce(ctx, record(key, "w1", later), func(ctx context.Context, abandoned *idempotency.Record) (*idempotency.Response, error) {
		got = abandoned
		return effect(sub, "taken-over", completed)(ctx, abandoned)
	})
	if err != nil || existing != nil {
		t.Fatalf("RunOnce over an ended lease = %+v, %v; want nil, nil", existing, err)
	}
	if got == nil || got.Owner != "lease" || got.StableID != lease.StableID {
		t.Errorf("do was given %+v, want the lease's record", got)
	}
	hasRow(t, sub, "taken-over", true)
	if rec := get(t, s, key, later); rec == nil || rec.Status != idempotency.StatusCompleted || rec.StableID != lease.StableID ||
		rec.Response == nil || rec.Response.StatusCode != 201 {
		t.Errorf("record after the take-over = %+v, want COMPLETED under the lease's stable id", rec)
	}
	if err := s.Complete(ctx, key, "lease", completed, nil); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("the old worker's Complete after the take-over = %v, want ErrNotOwner", err)
	}
}
