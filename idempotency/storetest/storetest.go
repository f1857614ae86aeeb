// Package storetest checks that an [idempotency.Store] keeps the contract
// the middleware relies on, as testing/slogtest does for slog handlers. A
// store's own tests call [Run]:
//
//	func TestStoreConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Subject {
//			return storetest.Subject{Store: newEmptyStore(t)}
//		})
//	}
//
// Run checks: of 100 goroutines inserting one key, one wins and the others
// get its record; of many takeovers of one dead worker's record, one wins;
// a record from its expiry on is replaced by exactly one of many concurrent
// inserts; an effect that fails leaves the record IN_PROGRESS and its owner's, with no
// answer stored (and, for a store with transactions, none of the effect's
// writes); a record from its expiry on is replaced by an insert; a sweep
// deletes the expired records and only those; keys are scoped by caller;
// leases and retention are judged on the store's own clock, whatever its
// callers' clocks say, and a live record comes back with the store's now
// ([idempotency.Record.ReadAt]); the principal is kept as its digest ([idempotency.PrincipalDigest]), never
// in clear (with [Subject.AtRest]); principals of any length (a 3,000
// character token, a 100 KB header) work; a record's fingerprint version is
// kept as given, 0 included; a record IN_PROGRESS under a live lease is never expired, even past
// its retention. A store that is an [idempotency.TxStore] is also checked
// in the single-transaction mode: RunOnce commits the work and the
// COMPLETED record once, rolls both back when the work fails or answers
// nothing, returns the record of a completed key or a live lease without
// running the work, holds the key (another RunOnce returns at once, and
// Get reads it IN_PROGRESS) while the work runs, lets one of 20 concurrent
// calls commit, replaces an expired record, rolls the work back when a
// lease-mode record of the key appears before the commit, and takes over a
// lease-mode record whose lease ended, keeping its stable id.
//
// The checks read records back through Insert, which returns the live record
// it conflicts with. They move the store's clock ([Subject.SetNow]) along
// with the times they give it, except where they check that the store
// keeps to its own. Times are whole microseconds, which a SQL timestamp
// keeps exactly.
package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// Subject is the store under test, with optional access to business rows
// written in the store's transaction.
type Subject struct {
	// Store is empty when given to a check.
	Store idempotency.Store
	// WriteRow, if not nil, writes a business row named name through the
	// transaction that ctx carries: ctx is the one Store.Complete gives its
	// commit hook. HasRow reports whether a row named name is stored. A
	// store without transactions (one whose commit hook's writes cannot be
	// undone) leaves both nil, and the rollback check then covers the
	// record only.
	WriteRow func(ctx context.Context, name string) error
	HasRow   func(ctx context.Context, name string) (bool, error)
	// SetNow sets the clock the store judges leases and retention on to t
	// (a clock.Manual the store was given). Required.
	SetNow func(t time.Time)
	// AtRest, if not nil, returns as text everything the store keeps about
	// its records (for a SQL store, every column of every row), so that the
	// check that a store keeps a digest of the principal, never the
	// principal (often a credential), can look at it. Nil skips that look.
	AtRest func(ctx context.Context) (string, error)
}

// t0 is the checks' time; no check reads a clock.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 678901000, time.UTC)

// Run runs every check as a subtest of t; newSubject returns a subject with
// an empty store for each.
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	checks := []struct {
		name string
		fn   func(*testing.T, Subject)
	}{
		{"InsertRoundTrip", testInsertRoundTrip},
		{"InsertRace", testInsertRace},
		{"TakeOver", testTakeOver},
		{"TakeOverRace", testTakeOverRace},
		{"CompleteStoresAnswer", testCompleteStoresAnswer},
		{"CompleteRefusesNonOwner", testCompleteRefusesNonOwner},
		{"FailedEffectRollsBack", testFailedEffectRollsBack},
		{"Release", testRelease},
		{"ExpiryReplaces", testExpiryReplaces},
		{"ExpiredReplaceRace", testExpiredReplaceRace},
		{"SweepDeletesOnlyExpired", testSweepDeletesOnlyExpired},
		{"NeverExpiresUnderALiveLease", testNeverExpiresUnderALiveLease},
		{"ScopedByCaller", testScopedByCaller},
		{"JudgesTimeOnItsOwnClock", testOwnClock},
		{"PrincipalKeptAsDigest", testPrincipalKeptAsDigest},
		{"LongPrincipals", testLongPrincipals},
		{"FingerprintVersionKept", testFingerprintVersionKept},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			sub := newSubject(t)
			if sub.SetNow == nil {
				t.Fatal("storetest: Subject.SetNow is nil; give the store a clock the test can set")
			}
			c.fn(t, sub)
		})
	}
	for _, c := range txChecks {
		t.Run(c.name, func(t *testing.T) {
			sub := newSubject(t)
			s, ok := sub.Store.(idempotency.TxStore)
			if !ok {
				t.Skip("the store is not an idempotency.TxStore")
			}
			c.fn(t, sub, s)
		})
	}
}

// fingerprint stands for the fingerprint of a request with body s.
func fingerprint(s string) [sha256.Size]byte { return sha256.Sum256([]byte(s)) }

// fingerprintVersion is the [idempotency.Record.FingerprintVersion] the
// middleware makes records with. A store keeps any other as it is given.
const fingerprintVersion = 1

// record is an IN_PROGRESS record created at now with a one-minute lease
// and a one-hour retention.
func record(id idempotency.ID, owner string, now time.Time) *idempotency.Record {
	return &idempotency.Record{
		ID: id, Fingerprint: fingerprint("body"), FingerprintVersion: fingerprintVersion, Status: idempotency.StatusInProgress,
		StableID: "stable-" + owner, Owner: owner,
		LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
}

var key = idempotency.ID{Principal: "caller-a", Key: "key-1"}

// mustInsert inserts rec at rec.CreatedAt on the store's clock.
func mustInsert(t *testing.T, sub Subject, rec *idempotency.Record) {
	t.Helper()
	sub.SetNow(rec.CreatedAt)
	existing, inserted, err := sub.Store.Insert(context.Background(), rec)
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	if !inserted {
		t.Fatalf("Insert of %v: not inserted, found %+v", rec.ID, existing)
	}
}

// lookup returns the live record id at now, read through Insert, or nil
// when there is none. A nil answer leaves a probe record behind.
func lookup(t *testing.T, sub Subject, id idempotency.ID, now time.Time) *idempotency.Record {
	t.Helper()
	probe := record(id, "probe", now)
	probe.Fingerprint = fingerprint("probe")
	sub.SetNow(now)
	existing, inserted, err := sub.Store.Insert(context.Background(), probe)
	if err != nil {
		t.Fatalf("Insert (reading %v back): %v", id, err)
	}
	if inserted {
		return nil
	}
	return existing
}

func sameRecord(t *testing.T, got, want *idempotency.Record) {
	t.Helper()
	if got == nil {
		t.Fatalf("record %v is absent, want %+v", want.ID, want)
	}
	if got.ID != want.ID || got.Fingerprint != want.Fingerprint || got.FingerprintVersion != want.FingerprintVersion || got.Status != want.Status ||
		got.StableID != want.StableID || got.Owner != want.Owner ||
		!got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) ||
		(got.Status == idempotency.StatusInProgress && !got.LockedUntil.Equal(want.LockedUntil)) {
		t.Errorf("record =\n\t%+v\nwant\n\t%+v", got, want)
	}
}

func testInsertRoundTrip(t *testing.T, sub Subject) {
	rec := record(key, "w1", t0)
	mustInsert(t, sub, rec)
	got := lookup(t, sub, key, t0.Add(time.Second))
	sameRecord(t, got, rec)
	if got.Response != nil {
		t.Errorf("IN_PROGRESS record has a response: %+v", got.Response)
	}
}

func testInsertRace(t *testing.T, sub Subject) {
	winners, seen := raceInsert(t, sub, 100, t0)
	if len(winners) != 1 {
		t.Fatalf("%d inserts won (%v), want exactly 1", len(winners), winners)
	}
	if seen[winners[0]] != 99 || len(seen) != 1 {
		t.Errorf("losers saw owners %v, want all 99 to see the winner %s", seen, winners[0])
	}
}

// raceInsert has n goroutines insert a record for key at the same moment,
// each with its own owner, and returns the owners whose Insert won and how
// many losers saw each owner as the existing record's.
func raceInsert(t *testing.T, sub Subject, n int, at time.Time) (winners []string, seen map[string]int) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	seen = map[string]int{}
	start := make(chan struct{})
	sub.SetNow(at)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			owner := fmt.Sprintf("w%d", i)
			ex, inserted, err := sub.Store.Insert(context.Background(), record(key, owner, at))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("Insert by %s: %v", owner, err)
			case inserted:
				winners = append(winners, owner)
			case ex == nil:
				t.Errorf("Insert by %s: not inserted and no existing record", owner)
			default:
				seen[ex.Owner]++
			}
		}()
	}
	close(start)
	wg.Wait()
	return winners, seen
}

// deadRecord inserts a record whose worker "dead" has a lease ending at
// t0+1m, and returns the time just after it.
func deadRecord(t *testing.T, sub Subject) (*idempotency.Record, time.Time) {
	rec := record(key, "dead", t0)
	mustInsert(t, sub, rec)
	return rec, rec.LockedUntil
}

func testTakeOver(t *testing.T, sub Subject) {
	ctx := context.Background()
	rec, ended := deadRecord(t, sub)
	later := ended.Add(time.Hour)

	for _, c := range []struct {
		name string
		from string
		now  time.Time
	}{
		{"while the lease is alive", "dead", ended.Add(-time.Microsecond)},
		{"from an owner that does not hold it", "someone-else", ended},
		{"of an expired record", "dead", rec.ExpiresAt},
	} {
		sub.SetNow(c.now)
		ok, err := sub.Store.TakeOver(ctx, key, c.from, "new", c.now, later)
		if err != nil || ok {
			t.Errorf("TakeOver %s = %v, %v; want false, nil", c.name, ok, err)
		}
	}
	if ok, err := sub.Store.TakeOver(ctx, idempotency.ID{Principal: "nobody", Key: "none"}, "dead", "new", ended, later); err != nil || ok {
		t.Errorf("TakeOver of an absent record = %v, %v; want false, nil", ok, err)
	}

	sub.SetNow(ended)
	ok, err := sub.Store.TakeOver(ctx, key, "dead", "new", ended, later)
	if err != nil || !ok {
		t.Fatalf("TakeOver when the lease has ended = %v, %v; want true, nil", ok, err)
	}
	want := *rec
	want.Owner, want.LockedUntil = "new", later
	sameRecord(t, lookup(t, sub, key, ended), &want)

	// A COMPLETED record is never taken over.
	if err := sub.Store.Complete(ctx, key, "new", &idempotency.Response{StatusCode: 201}, nil); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	sub.SetNow(later.Add(time.Minute))
	if ok, err := sub.Store.TakeOver(ctx, key, "", "thief", later.Add(time.Minute), later.Add(time.Hour)); err != nil || ok {
		t.Errorf("TakeOver of a COMPLETED record = %v, %v; want false, nil", ok, err)
	}
}

func testTakeOverRace(t *testing.T, sub Subject) {
	_, ended := deadRecord(t, sub)
	const n = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []string
	)
	start := make(chan struct{})
	sub.SetNow(ended)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			to := fmt.Sprintf("w%d", i)
			ok, err := sub.Store.TakeOver(context.Background(), key, "dead", to, ended, ended.Add(time.Minute))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("TakeOver by %s: %v", to, err)
			}
			if ok {
				winners = append(winners, to)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d takeovers won (%v), want exactly 1", len(winners), winners)
	}
	if got := lookup(t, sub, key, ended); got == nil || got.Owner != winners[0] {
		t.Errorf("after the race the record is %+v, want owner %s", got, winners[0])
	}
}

func testCompleteStoresAnswer(t *testing.T, sub Subject) {
	ctx := context.Background()
	rec := record(key, "w1", t0)
	mustInsert(t, sub, rec)
	resp := &idempotency.Response{
		StatusCode: 201,
		Header:     http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/p1"}},
		Body:       []byte("{\"id\":\"p1\"}\n\x00\xff"),
	}
	ran := 0
	err := sub.Store.Complete(ctx, key, "w1", resp, func(ctx context.Context) error {
		ran++
		if sub.WriteRow != nil {
			return sub.WriteRow(ctx, "row-1")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if ran != 1 {
		t.Errorf("the effect ran %d times, want 1", ran)
	}
	got := lookup(t, sub, key, t0.Add(2*time.Minute))
	want := *rec
	want.Status, want.Owner = idempotency.StatusCompleted, ""
	sameRecord(t, got, &want)
	if got.Response == nil || got.Response.StatusCode != 201 || string(got.Response.Body) != string(resp.Body) ||
		fmt.Sprint(got.Response.Header) != fmt.Sprint(resp.Header) {
		t.Errorf("stored answer = %+v, want %+v", got.Response, resp)
	}
	hasRow(t, sub, "row-1", true)

	// A COMPLETED record is not completed again.
	if err := sub.Store.Complete(ctx, key, "w1", resp, nil); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("second Complete = %v, want ErrNotOwner", err)
	}
}

func hasRow(t *testing.T, sub Subject, name string, want bool) {
	t.Helper()
	if sub.HasRow == nil {
		return
	}
	got, err := sub.HasRow(context.Background(), name)
	if err != nil {
		t.Fatalf("HasRow(%s): %v", name, err)
	}
	if got != want {
		t.Errorf("business row %s stored = %v, want %v", name, got, want)
	}
}

func testCompleteRefusesNonOwner(t *testing.T, sub Subject) {
	ctx := context.Background()
	_, ended := deadRecord(t, sub)
	sub.SetNow(ended)
	if ok, err := sub.Store.TakeOver(ctx, key, "dead", "new", ended, ended.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("TakeOver = %v, %v", ok, err)
	}
	ran := false
	effect := func(ctx context.Context) error {
		ran = true
		if sub.WriteRow != nil {
			return sub.WriteRow(ctx, "late")
		}
		return nil
	}
	err := sub.Store.Complete(ctx, key, "dead", &idempotency.Response{StatusCode: 201}, effect)
	if !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete by the worker that lost the lease = %v, want ErrNotOwner", err)
	}
	err = sub.Store.Complete(ctx, idempotency.ID{Principal: "nobody", Key: "none"}, "dead", &idempotency.Response{StatusCode: 201}, effect)
	if !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete of an absent record = %v, want ErrNotOwner", err)
	}
	if ran {
		t.Error("the effect ran for a worker that does not own the record")
	}
	hasRow(t, sub, "late", false)
	if got := lookup(t, sub, key, ended); got == nil || got.Status != idempotency.StatusInProgress || got.Owner != "new" {
		t.Errorf("record = %+v, want IN_PROGRESS owned by new", got)
	}
}

var errEffect = errors.New("storetest: the effect failed")

func testFailedEffectRollsBack(t *testing.T, sub Subject) {
	ctx := context.Background()
	rec := record(key, "w1", t0)
	mustInsert(t, sub, rec)
	err := sub.Store.Complete(ctx, key, "w1", &idempotency.Response{StatusCode: 201, Body: []byte("lost")}, func(ctx context.Context) error {
		if sub.WriteRow != nil {
			if err := sub.WriteRow(ctx, "half-done"); err != nil {
				return err
			}
		}
		return errEffect
	})
	if !errors.Is(err, errEffect) {
		t.Fatalf("Complete with a failing effect = %v, want its error", err)
	}
	hasRow(t, sub, "half-done", false)
	sameRecord(t, lookup(t, sub, key, t0.Add(time.Second)), rec)

	// The owner still holds it and can finish.
	if err := sub.Store.Complete(ctx, key, "w1", &idempotency.Response{StatusCode: 201}, nil); err != nil {
		t.Errorf("Complete after the failed one: %v", err)
	}
}

func testRelease(t *testing.T, sub Subject) {
	ctx := context.Background()
	mustInsert(t, sub, record(key, "w1", t0))
	if err := sub.Store.Release(ctx, key, "other"); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Release by a non-owner = %v, want ErrNotOwner", err)
	}
	if err := sub.Store.Release(ctx, key, "w1"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := lookup(t, sub, key, t0.Add(time.Second)); got != nil {
		t.Errorf("after Release the record is %+v, want absent", got)
	}
	if err := sub.Store.Release(ctx, key, "w1"); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Release of a released record = %v, want ErrNotOwner", err)
	}
}

func testExpiryReplaces(t *testing.T, sub Subject) {
	ctx := context.Background()
	old := record(key, "w1", t0)
	old.FingerprintVersion = fingerprintVersion + 1 // the replacement's is its own
	mustInsert(t, sub, old)
	if err := sub.Store.Complete(ctx, key, "w1", &idempotency.Response{StatusCode: 201, Body: []byte("old")}, nil); err != nil {
		t.Fatal(err)
	}

	// Still live a microsecond before its expiry.
	early := record(key, "w2", old.ExpiresAt.Add(-time.Microsecond))
	early.Fingerprint = fingerprint("other body")
	sub.SetNow(early.CreatedAt)
	ex, inserted, err := sub.Store.Insert(ctx, early)
	if err != nil || inserted || ex == nil || ex.Owner != "" || ex.Status != idempotency.StatusCompleted {
		t.Fatalf("Insert before expiry = %+v, %v, %v; want the COMPLETED record", ex, inserted, err)
	}

	fresh := record(key, "w3", old.ExpiresAt)
	fresh.Fingerprint = fingerprint("other body")
	fresh.StableID = "stable-new"
	sub.SetNow(fresh.CreatedAt)
	ex, inserted, err = sub.Store.Insert(ctx, fresh)
	if err != nil || !inserted {
		t.Fatalf("Insert at expiry = %+v, %v, %v; want inserted", ex, inserted, err)
	}
	got := lookup(t, sub, key, old.ExpiresAt.Add(time.Second))
	sameRecord(t, got, fresh)
	if got.Response != nil {
		t.Errorf("the replacing record kept the expired one's answer %+v", got.Response)
	}
}

func testExpiredReplaceRace(t *testing.T, sub Subject) {
	old := record(key, "old", t0)
	mustInsert(t, sub, old)
	winners, seen := raceInsert(t, sub, 50, old.ExpiresAt)
	if len(winners) != 1 {
		t.Fatalf("%d inserts replaced the expired record (%v), want exactly 1", len(winners), winners)
	}
	if seen[winners[0]] != 49 || len(seen) != 1 {
		t.Errorf("losers saw owners %v, want all 49 to see the winner %s", seen, winners[0])
	}
}

func testSweepDeletesOnlyExpired(t *testing.T, sub Subject) {
	ctx := context.Background()
	ids := make([]idempotency.ID, 4)
	for i := range ids {
		ids[i] = idempotency.ID{Principal: "caller-a", Key: fmt.Sprintf("key-%d", i)}
		// Record i expires at t0 + i hours + 1h.
		rec := record(ids[i], "w", t0.Add(time.Duration(i)*time.Hour))
		mustInsert(t, sub, rec)
		if i%2 == 0 {
			if err := sub.Store.Complete(ctx, ids[i], "w", &idempotency.Response{StatusCode: 200}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// At t0+2h, records 0 (COMPLETED) and 1 (IN_PROGRESS) have expired.
	sub.SetNow(t0.Add(2 * time.Hour))
	n, err := sub.Store.Sweep(ctx, t0.Add(2*time.Hour))
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if n != 2 {
		t.Errorf("Sweep deleted %d records, want 2", n)
	}
	if n, err := sub.Store.Sweep(ctx, t0.Add(2*time.Hour)); err != nil || n != 0 {
		t.Errorf("second Sweep = %d, %v; want 0, nil", n, err)
	}
	// Reading at t0 tells a deleted record (absent) from a kept one.
	for i, id := range ids {
		got := lookup(t, sub, id, t0)
		if swept := i < 2; swept != (got == nil) {
			t.Errorf("record %d expiring at t0+%dh: present = %v after a sweep at t0+2h", i, i+1, got != nil)
		}
	}
}

// testNeverExpiresUnderALiveLease: a record taken over just before its
// retention ends, with a lease that outlasts it, is neither replaced nor
// swept while that lease is alive, so that a resend does not find the key
// new and run the request again under a new stable id while the worker
// runs; once the lease ends it is expired like any other.
func testNeverExpiresUnderALiveLease(t *testing.T, sub Subject) {
	ctx := context.Background()
	ids := []idempotency.ID{{Principal: "caller-a", Key: "key-replaced"}, {Principal: "caller-a", Key: "key-swept"}}
	var rec *idempotency.Record
	for _, id := range ids {
		rec = record(id, "dead", t0)
		mustInsert(t, sub, rec)
	}
	takeover := rec.ExpiresAt.Add(-time.Second)
	leaseEnds := takeover.Add(time.Minute)
	sub.SetNow(takeover)
	for _, id := range ids {
		if ok, err := sub.Store.TakeOver(ctx, id, "dead", "w2", takeover, leaseEnds); err != nil || !ok {
			t.Fatalf("TakeOver a second before the retention ends = %v, %v; want true, nil", ok, err)
		}
	}

	during := rec.ExpiresAt.Add(30 * time.Second)
	sub.SetNow(during)
	if n, err := sub.Store.Sweep(ctx, during); err != nil || n != 0 {
		t.Errorf("Sweep past the retention under the live lease = %d, %v; want 0, nil", n, err)
	}
	if got := lookup(t, sub, ids[0], during); got == nil || got.Owner != "w2" || got.StableID != rec.StableID {
		t.Fatalf("Insert past the retention under the live lease found %+v; want the record w2 holds", got)
	}

	// Once the lease has ended, the record is expired.
	if got := lookup(t, sub, ids[0], leaseEnds); got != nil {
		t.Errorf("Insert when the lease has ended found %+v; want the expired record replaced", got)
	}
	sub.SetNow(leaseEnds)
	if n, err := sub.Store.Sweep(ctx, leaseEnds); err != nil || n != 1 {
		t.Errorf("Sweep when the lease has ended = %d, %v; want 1, nil", n, err)
	}
}

func testScopedByCaller(t *testing.T, sub Subject) {
	ctx := context.Background()
	a := idempotency.ID{Principal: "caller-a", Key: "shared"}
	b := idempotency.ID{Principal: "caller-b", Key: "shared"}
	mustInsert(t, sub, record(a, "wa", t0))
	recB := record(b, "wb", t0)
	recB.Fingerprint = fingerprint("b's body")
	mustInsert(t, sub, recB)

	if err := sub.Store.Complete(ctx, b, "wa", &idempotency.Response{StatusCode: 201}, nil); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete of b's record by a's worker = %v, want ErrNotOwner", err)
	}
	if err := sub.Store.Complete(ctx, a, "wa", &idempotency.Response{StatusCode: 201, Body: []byte("a")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := sub.Store.Release(ctx, b, "wb"); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, sub, a, t0); got == nil || got.Status != idempotency.StatusCompleted || string(got.Response.Body) != "a" {
		t.Errorf("a's record = %+v, want COMPLETED with a's answer", got)
	}
	if got := lookup(t, sub, b, t0); got != nil {
		t.Errorf("b's record = %+v, want released", got)
	}
}

// testOwnClock: the store judges leases and retention on its own clock.
// Callers whose clocks are ahead of it or behind it (hosts whose clocks
// disagree) change when a record was created, when its lease ends and when
// it expires not at all: only how long each lasts is theirs.
func testOwnClock(t *testing.T, sub Subject) {
	ctx := context.Background()
	sub.SetNow(t0)
	ahead := t0.Add(30 * time.Second) // a host whose clock is 30 s ahead
	rec := record(key, "a", ahead)    // its lease one minute, its retention one hour
	if _, inserted, err := sub.Store.Insert(ctx, rec); err != nil || !inserted {
		t.Fatalf("Insert = %v, %v; want inserted", inserted, err)
	}
	want := *rec
	want.CreatedAt, want.LockedUntil, want.ExpiresAt = t0, t0.Add(time.Minute), t0.Add(time.Hour)

	// A host two hours ahead sees the record as expired; the store does not.
	later := record(key, "c", t0.Add(2*time.Hour))
	later.Fingerprint = fingerprint("other body")
	ex, inserted, err := sub.Store.Insert(ctx, later)
	if err != nil || inserted {
		t.Fatalf("Insert by a host 2h ahead = %v, %v; want the live record", inserted, err)
	}
	sameRecord(t, ex, &want)
	if !ex.ReadAt.Equal(t0) {
		t.Errorf("the live record's ReadAt = %v; want the store's now, %v, whatever its caller's clock", ex.ReadAt, t0)
	}
	// A host two minutes ahead sees the lease as ended; the store does not.
	if ok, err := sub.Store.TakeOver(ctx, key, "a", "b", t0.Add(2*time.Minute), t0.Add(3*time.Minute)); err != nil || ok {
		t.Errorf("TakeOver by a host 2m ahead while the lease is alive = %v, %v; want false, nil", ok, err)
	}
	if n, err := sub.Store.Sweep(ctx, t0.Add(2*time.Hour)); err != nil || n != 0 {
		t.Errorf("Sweep by a host 2h ahead = %d, %v; want 0, nil", n, err)
	}

	// On the store's clock the lease ends; a host an hour behind takes the
	// record over, for a lease of one minute from the store's now.
	sub.SetNow(t0.Add(time.Minute))
	behind := t0.Add(-time.Hour)
	if ok, err := sub.Store.TakeOver(ctx, key, "a", "b", behind, behind.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("TakeOver by a host 1h behind once the lease has ended = %v, %v; want true, nil", ok, err)
	}
	want.Owner, want.LockedUntil = "b", t0.Add(2*time.Minute)
	sameRecord(t, lookup(t, sub, key, t0.Add(time.Minute)), &want)

	// The owner gives the record up: its lease ends at once, on any clock.
	if ok, err := sub.Store.TakeOver(ctx, key, "b", "", behind, behind); err != nil || !ok {
		t.Fatalf("TakeOver giving the record up = %v, %v; want true, nil", ok, err)
	}
	if ok, err := sub.Store.TakeOver(ctx, key, "", "d", behind, behind.Add(time.Minute)); err != nil || !ok {
		t.Errorf("TakeOver of a record given up = %v, %v; want true, nil", ok, err)
	}

	// The record expires on the store's clock, for every host.
	sub.SetNow(t0.Add(time.Hour))
	if n, err := sub.Store.Sweep(ctx, behind); err != nil || n != 1 {
		t.Errorf("Sweep by a host 1h behind once the record expired = %d, %v; want 1, nil", n, err)
	}
}

func testPrincipalKeptAsDigest(t *testing.T, sub Subject) {
	ctx := context.Background()
	const secret = "sk_live_51HzQ2eLkdIwHu7ix0Ff3"
	id := idempotency.ID{Principal: "Bearer " + secret, Key: "key-secret"}
	mustInsert(t, sub, record(id, "w1", t0))
	if err := sub.Store.Complete(ctx, id, "w1", &idempotency.Response{StatusCode: 201, Body: []byte("paid")}, nil); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if got := lookup(t, sub, id, t0); got == nil || got.ID != id || got.Status != idempotency.StatusCompleted {
		t.Fatalf("the record under the principal = %+v, want COMPLETED under %v", got, id)
	}
	if sub.AtRest == nil {
		return
	}
	rest, err := sub.AtRest(ctx)
	if err != nil {
		t.Fatalf("AtRest: %v", err)
	}
	if strings.Contains(rest, secret) {
		t.Errorf("the store keeps the principal in clear:\n%s", rest)
	}
	if digest := idempotency.PrincipalDigest(id.Principal); !strings.Contains(rest, digest) {
		t.Errorf("the store does not keep the principal's digest %s:\n%s", digest, rest)
	}
}

func testLongPrincipals(t *testing.T, sub Subject) {
	ctx := context.Background()
	for _, n := range []int{3000, 100 << 10} {
		// Two principals that differ only in their last character are two
		// callers.
		long := "Bearer " + randomToken(n)
		a := idempotency.ID{Principal: long + "a", Key: "key-long"}
		b := idempotency.ID{Principal: long + "b", Key: "key-long"}
		mustInsert(t, sub, record(a, "wa", t0))
		mustInsert(t, sub, record(b, "wb", t0))
		sub.SetNow(t0.Add(time.Minute))
		if ok, err := sub.Store.TakeOver(ctx, a, "wa", "wa2", t0.Add(time.Minute), t0.Add(2*time.Minute)); err != nil || !ok {
			t.Fatalf("TakeOver with a %d-byte principal = %v, %v", len(a.Principal), ok, err)
		}
		if err := sub.Store.Complete(ctx, a, "wa2", &idempotency.Response{StatusCode: 201, Body: []byte("a")}, nil); err != nil {
			t.Fatalf("Complete with a %d-byte principal: %v", len(a.Principal), err)
		}
		if got := lookup(t, sub, a, t0.Add(time.Minute)); got == nil || got.Status != idempotency.StatusCompleted || string(got.Response.Body) != "a" {
			t.Errorf("the record of a %d-byte principal = %+v, want COMPLETED with its answer", len(a.Principal), got)
		}
		if err := sub.Store.Release(ctx, b, "wb"); err != nil {
			t.Errorf("Release with a %d-byte principal: %v", len(b.Principal), err)
		}
	}
}

func testFingerprintVersionKept(t *testing.T, sub Subject) {
	// 0 is no version: a store that wrote it as 1 would make a record
	// that never matches match.
	for _, v := range []int{0, fingerprintVersion, fingerprintVersion + 1} {
		id := idempotency.ID{Principal: "caller-a", Key: fmt.Sprintf("key-v%d", v)}
		rec := record(id, "w1", t0)
		rec.FingerprintVersion = v
		mustInsert(t, sub, rec)
		if got := lookup(t, sub, id, t0); got == nil || got.FingerprintVersion != v {
			t.Errorf("a record fingerprinted with version %d reads back as %+v", v, got)
		}
	}
}

// randomToken returns n characters of base64url that look random, the
// same on every call: a credential that a database cannot compress, as a
// real token is (a repeated character compresses to fit any index).
// pgtest.RandomToken is the same for the module's own PostgreSQL tests.
func randomToken(n int) string {
	var b strings.Builder
	block := sha256.Sum256([]byte("storetest"))
	for b.Len() < n {
		b.WriteString(base64.RawURLEncoding.EncodeToString(block[:]))
		block = sha256.Sum256(block[:])
	}
	return b.String()[:n]
}
