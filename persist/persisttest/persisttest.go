// Package persisttest is the conformance suite for implementations of
// persist.Store, in the manner of testing/slogtest: every store, the ones in
// package persist and any an app writes, should pass Run.
//
// The suite compares records modulo encoding: times by instant (not by
// location or monotonic reading), and nil and empty headers and bodies as
// equal. Everything else must round-trip exactly.
package persisttest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/persist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Run runs the conformance suite against the stores newStore returns. It
// calls newStore once per subtest, which must return an empty store and
// release it with t.Cleanup. Subtests run in parallel with each other, so
// the stores they get must not share state.
func Run(t *testing.T, newStore func(t *testing.T) persist.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s persist.Store)
	}{
		{"a record reads back as written", testRoundTrip},
		{"a write replaces its key's record", testReplace},
		{"a record read or written is the caller's own copy", testCopiesNotShared},
		{"List gives the oldest first, by key among equals", testListOrder},
		{"List selects by state and by Name", testListFilters},
		{"a Name's list follows its records' changes", testListByNameFollowsChanges},
		{"a missing key is ErrNotFound", testNotFound},
		{"Delete removes the version named and no other", testDelete},
		{"keys like paths or alike but for case stay apart", testKeys},
		{"an invalid record is refused", testRejectsInvalid},
		{"many goroutines may read and write at once", testConcurrent},
		{"Prune removes what its rule selects", testPrune},
		{"a new intent wins only over lower Seqs of its Name", testNewIntent},
		{"of two racing new intents of an action one wins", testNewIntentOneWinner},
		{"a record changes only from the version read", testWriteIfVersion},
		{"of two racing changes of a version one wins", testWriteIfVersionOneWinner},
		{"a write without a new Rev is refused", testVersionIsNew},
		{"a writer tells its own write on re-read", testUnknownResultRecognised},
		{"a deferred write is checked as any other", testDeferredWriteChecksAlike},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// Put writes rec over whatever s holds with rec.Key, with a new Rev that
// it sets on rec: it reads the stored version and writes against it (or
// against none). It is for setting up tests, not how a client writes: it
// checks nothing of what it replaces, but rec must keep its Name. A key not stored yet is a new
// intent (see persist.Store's Write): rec's Seq must be above every
// stored record of its Name.
func Put(ctx context.Context, s persist.Store, rec *persist.Record) error {
	for range 100 {
		cur, err := s.Get(ctx, rec.Key)
		if errors.Is(err, persist.ErrNotFound) {
			cur, err = nil, nil
		}
		if err != nil {
			return err
		}
		rec.Rev = persist.NewRev()
		err = s.Write(ctx, rec, cur)
		var ce *persist.ConflictError
		if !errors.As(err, &ce) || cur == nil && ce.Current != nil && ce.Current.Key != rec.Key {
			// Done, or refused for good: an action's later intent.
			return err
		}
		// Changed since read: read again.
	}
	return fmt.Errorf("persisttest: %s changed under every one of 100 writes", rec.Key)
}

// put is Put, failing the test on an error.
func put(t testing.TB, s persist.Store, rec *persist.Record, m ...any) {
	t.Helper()
	require.NoError(t, Put(context.Background(), s, rec), m...)
}

// stored returns the record s holds for key, failing the test if none.
func stored(t testing.TB, s persist.Store, key string) *persist.Record {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	require.NoError(t, err, "get %s", key)
	return r
}

// next returns a copy of r, as a writer makes its next version: with a
// new Rev.
func next(r *persist.Record) *persist.Record {
	c := r.Clone()
	c.Rev = persist.NewRev()
	return c
}

// base is the instant most of the suite's records are created at, in a zone
// other than UTC, so that a store that keeps the zone is not mistaken for one
// that returns a different instant.
var base = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("CET", 3600))

// NewRecord returns a valid, fully populated record for key, created at
// created, as the suite saves it: the only intent of its own action
// ("checkout:" + key), without a Rev (Put sets one). Tests of stores may
// use it too.
func NewRecord(key string, created time.Time) *persist.Record {
	return &persist.Record{
		Key:    key,
		Name:   "checkout:" + key,
		Method: http.MethodPost,
		URL:    "https://api.example.com/v1/payments",
		Header: http.Header{
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {key},
			"X-Multi":         {"a", "b"},
		},
		Body:        []byte(`{"amount":1999,"currency":"EUR","key":"` + key + `"}`),
		Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		CreatedAt:   created,
		UpdatedAt:   created,
		State:       persist.StateNew,
		Clocks: &persist.Clocks{
			ArmBoot: "boot-1", Armed: 90 * time.Minute, WriteBoot: "boot-1", Written: 91 * time.Minute,
			ArmMark: created, Mark: created.Add(time.Minute),
		},
	}
}

// resolve returns r's next version (see next), moved to StateSucceeded
// with a response, updated at updated.
func resolve(r *persist.Record, updated time.Time) *persist.Record {
	r = next(r)
	r.State = persist.StateSucceeded
	r.Attempts = 2
	r.UpdatedAt = updated
	r.Response = &persist.Response{
		StatusCode: http.StatusCreated,
		Header:     http.Header{"Content-Type": {"application/json"}, "Idempotent-Replayed": {"true"}},
		Body:       []byte(`{"id":"pay_1","status":"succeeded"}`),
		Replayed:   true,
	}
	return r
}

// AssertRecord checks that got is want as a store returns it: with
// persist.FormatVersion, and equal modulo encoding (see the package docs).
// A want without a Rev matches any Rev.
//
// It reports a mismatch with t.Errorf and returns false.
func AssertRecord(t testing.TB, want, got *persist.Record) bool {
	t.Helper()
	if got == nil {
		t.Errorf("record %s: got nil", want.Key)
		return false
	}
	w := canonical(want)
	w.Version = persist.FormatVersion
	if w.Rev == "" {
		w.Rev = got.Rev
	}
	return assert.Equal(t, w, canonical(got), "record %s", want.Key)
}

// selects reports whether f selects r, as List must: it meets each
// condition of f that is set.
func selects(f persist.Filter, r *persist.Record) bool {
	return (f.Name == "" || r.Name == f.Name) && (!f.Unresolved || !r.State.Resolved())
}

// wantConflict reports an error unless err is a *persist.ConflictError,
// which it returns.
func wantConflict(t testing.TB, err error, m ...any) (ce *persist.ConflictError) {
	t.Helper()
	assert.ErrorAs(t, err, &ce, m...)
	return ce
}

// wantKeys reports an error if got does not hold the keys want, in order.
func wantKeys(t testing.TB, got []*persist.Record, want []string, m ...any) {
	t.Helper()
	if k := keys(got); !slices.Equal(k, want) {
		assert.Equal(t, want, k, m...)
	}
}

// wantLen stops the test if got does not hold n records.
func wantLen(t testing.TB, got []*persist.Record, n int, m ...any) {
	t.Helper()
	require.Len(t, keys(got), n, m...)
}

// listed returns the records s lists for f, failing the test on an error.
func listed(t testing.TB, s persist.Store, f persist.Filter) []*persist.Record {
	t.Helper()
	recs, err := s.List(context.Background(), f)
	require.NoError(t, err, "list %+v", f)
	return recs
}

// canonical returns a copy of r in the form the suite compares.
func canonical(r *persist.Record) *persist.Record {
	c := r.Clone()
	c.CreatedAt = c.CreatedAt.UTC()
	c.UpdatedAt = c.UpdatedAt.UTC()
	if c.Clocks != nil {
		c.Clocks.ArmMark, c.Clocks.Mark = c.Clocks.ArmMark.UTC(), c.Clocks.Mark.UTC()
	}
	if len(c.Header) == 0 {
		c.Header = nil
	}
	if len(c.Body) == 0 {
		c.Body = nil
	}
	if c.Response != nil {
		if len(c.Response.Header) == 0 {
			c.Response.Header = nil
		}
		if len(c.Response.Body) == 0 {
			c.Response.Body = nil
		}
	}
	return c
}

func keys(recs []*persist.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Key
	}
	return out
}

func testRoundTrip(t *testing.T, s persist.Store) {
	ctx := context.Background()
	now := time.Now().In(base.Location()) // with a monotonic reading
	recs := []*persist.Record{
		NewRecord("k-new", now),
		resolve(NewRecord("k-resolved", base), base.Add(time.Minute)),
		{Key: "k-minimal", Method: http.MethodPut, URL: "/x", State: persist.StatePending, CreatedAt: base},
		{Key: "k-empty", Method: http.MethodPost, URL: "/x", State: persist.StateFailed, CreatedAt: base,
			Header: http.Header{}, Body: []byte{}, Response: &persist.Response{StatusCode: 402, Header: http.Header{}, Body: []byte{}}},
	}
	for _, r := range recs {
		put(t, s, r, "save %s", r.Key)
	}
	for _, r := range recs {
		got, err := s.Get(ctx, r.Key)
		require.NoError(t, err, "get %s", r.Key)
		AssertRecord(t, r, got)
		assert.Equal(t, r.Rev, got.Rev, "Rev of %s: want the written one", r.Key)
		if !got.CreatedAt.Equal(r.CreatedAt) {
			t.Errorf("CreatedAt of %s: %v, want %v", r.Key, got.CreatedAt, r.CreatedAt)
		}
	}
}

func testReplace(t *testing.T, s persist.Store) {
	ctx := context.Background()
	v1 := NewRecord("k1", base)
	put(t, s, v1)
	v2 := resolve(v1, base.Add(time.Second))
	require.NoError(t, s.Write(ctx, v2, v1))
	AssertRecord(t, v2, stored(t, s, "k1"))
	wantKeys(t, listed(t, s, persist.Filter{}), []string{"k1"}, "one record per key")
}

func testCopiesNotShared(t *testing.T, s persist.Store) {
	in := resolve(NewRecord("k1", base), base)
	put(t, s, in)
	want := in.Clone()

	// Change everything the caller still holds.
	in.Header.Set("Content-Type", "changed")
	in.Body[0] = 'X'
	in.Response.Header.Set("Content-Type", "changed")
	in.Response.Body[0] = 'X'
	in.State = persist.StateFailed

	got := stored(t, s, "k1")
	AssertRecord(t, want, got)

	// Change what Get and List returned.
	got.Header.Set("Content-Type", "changed")
	got.Body[0] = 'X'
	got.Response.Body[0] = 'X'
	got.Response.Header["X-New"] = []string{"1"}
	listed := listed(t, s, persist.Filter{})
	wantLen(t, listed, 1)
	AssertRecord(t, want, listed[0])
	listed[0].Header.Set("Content-Type", "changed")
	listed[0].Body[0] = 'X'

	AssertRecord(t, want, stored(t, s, "k1"))
}

func testListOrder(t *testing.T, s persist.Store) {
	wantLen(t, listed(t, s, persist.Filter{}), 0, "a new store lists nothing")

	// Saved out of order; b and c share a creation time and sort by key.
	saves := []struct {
		key string
		at  time.Duration
	}{{"d", 3 * time.Second}, {"c", time.Second}, {"a", 0}, {"e", -time.Hour}, {"b", time.Second}}
	for _, sv := range saves {
		put(t, s, NewRecord(sv.key, base.Add(sv.at)))
	}
	wantKeys(t, listed(t, s, persist.Filter{}), []string{"e", "a", "b", "c", "d"})
}

func testListFilters(t *testing.T, s persist.Store) {
	states := []persist.State{
		persist.StateNew, persist.StatePending, persist.StateSucceeded, persist.StateFailed,
		persist.StateRejected, persist.StateExpired, persist.StateVoid,
	}
	for i, st := range states {
		for _, name := range []string{"one", "two", ""} {
			r := NewRecord(fmt.Sprintf("%s-%s", name, st), base.Add(time.Duration(i)*time.Second))
			r.Name, r.Seq = name, uint64(i+1)
			r.State = st
			put(t, s, r)
		}
	}
	tests := []struct {
		name   string
		filter persist.Filter
		want   []string
	}{
		{"all", persist.Filter{}, nil},
		{"name", persist.Filter{Name: "one"}, []string{
			"one-new", "one-pending", "one-succeeded", "one-failed", "one-rejected", "one-expired", "one-void"}},
		{"unresolved", persist.Filter{Unresolved: true}, []string{
			"-new", "one-new", "two-new", "-pending", "one-pending", "two-pending", "-expired", "one-expired", "two-expired"}},
		{"name and unresolved", persist.Filter{Name: "two", Unresolved: true}, []string{"two-new", "two-pending", "two-expired"}},
		{"no match", persist.Filter{Name: "three"}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := listed(t, s, tt.filter)
			if tt.want == nil {
				wantLen(t, got, 3*len(states))
				return
			}
			wantKeys(t, got, tt.want)
			for _, r := range got {
				if !selects(tt.filter, r) {
					t.Errorf("%s does not match %+v", r.Key, tt.filter)
				}
			}
		})
	}
}

// testListByNameFollowsChanges: a Name's list follows the records as they
// are replaced, deleted and pruned; a record never changes its Name.
func testListByNameFollowsChanges(t *testing.T, s persist.Store) {
	ctx := context.Background()
	seq := uint64(0)
	named := func(key, name string, st persist.State, at time.Duration) *persist.Record {
		r := NewRecord(key, base.Add(at))
		seq++
		r.Name, r.State, r.Seq = name, st, seq
		return r
	}
	list := func(name string, want ...string) {
		t.Helper()
		wantKeys(t, listed(t, s, persist.Filter{Name: name}), want)
	}
	put(t, s, named("k1", "a", persist.StatePending, 0))
	put(t, s, named("k2", "a", persist.StateSucceeded, time.Second))
	put(t, s, named("k3", "a", persist.StateSucceeded, 2*time.Second))
	list("a", "k1", "k2", "k3")

	// Written again under another Name, or under none: refused.
	for _, name := range []string{"b", ""} {
		cur := stored(t, s, "k1")
		w := cur.Clone()
		w.Name, w.Rev = name, persist.NewRev()
		if err := s.Write(ctx, w, cur); err == nil || errors.As(err, new(*persist.ConflictError)) {
			t.Errorf("k1 written under Name %q: error %v, want the refusal of a change of Name", name, err)
		}
	}
	list("a", "k1", "k2", "k3")
	list("b")
	// A new intent of a needs a Seq above a's records only, not above
	// those deleted.
	require.NoError(t, s.Delete(ctx, stored(t, s, "k3")))
	k6 := NewRecord("k6", base.Add(5*time.Second))
	k6.Name, k6.Seq, k6.Rev = "a", 3, persist.NewRev()
	require.NoError(t, s.Write(ctx, k6, nil), "a new intent above the records left in a")
	require.NoError(t, s.Delete(ctx, k6))

	// Changed, then deleted.
	put(t, s, named("k1", "a", persist.StateSucceeded, 0))
	list("a", "k1", "k2")
	require.NoError(t, s.Delete(ctx, stored(t, s, "k2")))
	list("a", "k1")
	require.NoError(t, s.Delete(ctx, stored(t, s, "k1")))
	list("a")

	// A new intent, then pruned.
	k4 := named("k4", "c", persist.StateNew, 3*time.Second)
	k4.Rev = persist.NewRev()
	require.NoError(t, s.Write(ctx, k4, nil))
	list("c", "k4")
	put(t, s, named("k4", "c", persist.StateSucceeded, 3*time.Second))
	_, err := persist.PruneFunc(ctx, s, func(r *persist.Record) bool { return r.Key == "k4" })
	require.NoError(t, err)
	list("c")
	k5 := named("k5", "c", persist.StateNew, 4*time.Second)
	k5.Rev = persist.NewRev()
	require.NoError(t, s.Write(ctx, k5, nil))
	list("c", "k5")
}

func testNotFound(t *testing.T, s persist.Store) {
	ctx := context.Background()
	got, err := s.Get(ctx, "absent")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	assert.Nil(t, got, "Get of an absent key returned a record")
}

// testDelete: Delete removes the version named, leaves the others, and
// succeeds again once it is gone (a retried delete); a version it does
// not name, or none, deletes nothing.
func testDelete(t *testing.T, s persist.Store) {
	ctx := context.Background()
	k1, k2 := NewRecord("k1", base), NewRecord("k2", base)
	put(t, s, k1)
	put(t, s, k2)
	require.NoError(t, s.Delete(ctx, k1))
	_, err := s.Get(ctx, "k1")
	assert.ErrorIs(t, err, persist.ErrNotFound, "deleted")
	assert.NoError(t, s.Delete(ctx, k1), "deleting again")
	never := NewRecord("never-saved", base)
	never.Rev = persist.NewRev()
	assert.NoError(t, s.Delete(ctx, never), "deleting an absent key")
	assert.Error(t, s.Delete(ctx, nil), "a delete without a version")
	noRev := k2.Clone()
	noRev.Rev = ""
	assert.Error(t, s.Delete(ctx, noRev), "a delete of a record without a Rev")
	wantKeys(t, listed(t, s, persist.Filter{}), []string{"k2"}, "the other record stays")

	put(t, s, k1, "a deleted key can be written again")
	stored(t, s, "k1")
}

// testKeys writes keys that a naive file store would turn into paths
// outside its directory, or into one file for two keys.
func testKeys(t *testing.T, s persist.Store) {
	ctx := context.Background()
	long := strings.Repeat("x", 254)
	ks := []string{
		"../../../../tmp/idem-escape", "/etc/passwd", "a/b", `a\b`, ".", "..", ".tmp-1", "LOCK",
		"abc", "ABC", "Abc", "key with spaces", "ünïcødé-🔑", "a\x00b", "nul\x00",
		"550e8400-e29b-41d4-a716-446655440000", long + "1", long + "2", strings.Repeat("k", 1000),
	}
	for i, k := range ks {
		put(t, s, NewRecord(k, base.Add(time.Duration(i)*time.Second)), "save %q", k)
	}
	for i, k := range ks {
		got, err := s.Get(ctx, k)
		if assert.NoError(t, err, "get %q", k) {
			AssertRecord(t, NewRecord(k, base.Add(time.Duration(i)*time.Second)), got)
		}
	}
	all := listed(t, s, persist.Filter{})
	wantKeys(t, all, ks, "every key is its own record")
	for _, r := range all {
		require.NoError(t, s.Delete(ctx, r), "delete %q", r.Key)
	}
	wantLen(t, listed(t, s, persist.Filter{}), 0)
}

func testRejectsInvalid(t *testing.T, s persist.Store) {
	ctx := context.Background()
	good := NewRecord("k1", base)
	put(t, s, good)
	tests := []struct {
		name   string
		change func(r *persist.Record)
	}{
		{"no key", func(r *persist.Record) { r.Key = "" }},
		{"no method", func(r *persist.Record) { r.Method = "" }},
		{"no URL", func(r *persist.Record) { r.URL = "" }},
		{"zero state", func(r *persist.Record) { r.State = "" }},
		{"unknown state", func(r *persist.Record) { r.State = "done" }},
		{"no creation time", func(r *persist.Record) { r.CreatedAt = time.Time{} }},
		{"a Rev with a space", func(r *persist.Record) { r.Rev = "a b" }},
		{"a Rev too long", func(r *persist.Record) { r.Rev = strings.Repeat("r", 65) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := next(good)
			tt.change(r)
			assert.Error(t, r.Validate(), "precondition: the record is invalid")
			assert.Error(t, s.Write(ctx, r, good))
		})
	}
	assert.Error(t, s.Write(ctx, nil, good), "nil record")
	AssertRecord(t, good, stored(t, s, "k1"))
	wantKeys(t, listed(t, s, persist.Filter{}), []string{"k1"}, "no invalid record was stored")
}

// testConcurrent writes, reads and lists from many goroutines at once; run
// it under -race. Each goroutine owns its keys, so the end state is known.
func testConcurrent(t *testing.T, s persist.Store) {
	ctx := context.Background()
	const workers, perWorker = 8, 6
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker*4)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				r := NewRecord(fmt.Sprintf("w%d-%d", w, i), base.Add(time.Duration(w*perWorker+i)*time.Millisecond))
				r.Rev = persist.NewRev()
				if err := s.Write(ctx, r, nil); err != nil {
					errs <- err
					continue
				}
				if _, err := s.List(ctx, persist.Filter{Unresolved: true}); err != nil {
					errs <- err
				}
				if i%2 == 0 {
					res := resolve(r, r.CreatedAt.Add(time.Second))
					if err := s.Write(ctx, res, r); err != nil {
						errs <- err
					}
				}
				if _, err := s.Get(ctx, r.Key); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	all := listed(t, s, persist.Filter{})
	wantLen(t, all, workers*perWorker)
	for _, r := range all {
		var w, i int
		_, err := fmt.Sscanf(r.Key, "w%d-%d", &w, &i)
		require.NoError(t, err)
		if r.State.Resolved() != (i%2 == 0) {
			t.Errorf("state of %s: %s", r.Key, r.State)
		}
	}
}

func testPrune(t *testing.T, s persist.Store) {
	ctx := context.Background()
	cutoff := base.Add(24 * time.Hour)
	old, recent := base, cutoff.Add(time.Second)
	var wantLeft []string
	add := func(key string, st persist.State, created, updated time.Time, pruned bool) {
		r := NewRecord(key, created)
		r.State, r.UpdatedAt = st, updated
		put(t, s, r)
		if !pruned {
			wantLeft = append(wantLeft, key)
		}
	}
	for _, st := range []persist.State{persist.StateSucceeded, persist.StateFailed, persist.StateRejected, persist.StateVoid} {
		add("old-"+string(st), st, old, old, true)
		add("recent-"+string(st), st, old, recent, false)
	}
	for _, st := range []persist.State{persist.StateNew, persist.StatePending, persist.StateExpired} {
		add("ancient-"+string(st), st, old.Add(-1000*time.Hour), old.Add(-1000*time.Hour), false)
	}
	add("old-no-update", persist.StateSucceeded, old, time.Time{}, true)
	add("recent-no-update", persist.StateSucceeded, recent, time.Time{}, false)
	add("at-cutoff", persist.StateSucceeded, old, cutoff, false)
	// Written again while pruning runs: drop judged the version it was
	// given, which is gone by the time it would be deleted.
	add("rewritten", persist.StateSucceeded, old, old, false)

	// Aged: last updated (or, never updated, created) before the cutoff.
	aged := func(r *persist.Record) bool {
		if !r.State.Resolved() {
			t.Errorf("unresolved %s passed to drop", r.Key)
		}
		if r.Key == "rewritten" {
			again := stored(t, s, r.Key)
			again.UpdatedAt = recent
			put(t, s, again)
		}
		at := r.UpdatedAt
		if at.IsZero() {
			at = r.CreatedAt
		}
		return at.Before(cutoff)
	}
	n, err := persist.PruneFunc(ctx, s, aged)
	require.NoError(t, err)
	assert.Equal(t, 5, n, "pruned")
	left := listed(t, s, persist.Filter{})
	slices.Sort(wantLeft)
	if got := slices.Sorted(slices.Values(keys(left))); !slices.Equal(got, wantLeft) {
		t.Errorf("left after pruning: %q, want %q", got, wantLeft)
	}

	n, err = persist.PruneFunc(ctx, s, aged)
	require.NoError(t, err)
	assert.Zero(t, n, "pruning again pruned")
}

// claimRecord returns a record of action name with seq, unique by key, with
// a Rev.
func claimRecord(key, name string, seq uint64) *persist.Record {
	r := NewRecord(key, base)
	r.Name, r.Seq, r.Rev = name, seq, persist.NewRev()
	return r
}

// testNewIntent: a Write without an old version wins only over records of
// its Name with a lower Seq, and not over its own key; a lost one says
// which record is the latest and writes nothing.
func testNewIntent(t *testing.T, s persist.Store) {
	ctx := context.Background()
	require.NoError(t, s.Write(ctx, claimRecord("a1", "act", 1), nil), "first intent")
	require.NoError(t, s.Write(ctx, claimRecord("b1", "other", 1), nil), "another action's intent")

	err := s.Write(ctx, claimRecord("a1-rival", "act", 1), nil)
	if ce := wantConflict(t, err, "a second intent of the same seq"); ce != nil && (ce.Current == nil || ce.Current.Key != "a1") {
		t.Errorf("lost write names %+v as latest, want a1", ce.Current)
	}
	_, err = s.Get(ctx, "a1-rival")
	assert.ErrorIs(t, err, persist.ErrNotFound, "a lost write writes nothing")
	wantConflict(t, s.Write(ctx, claimRecord("a0", "act", 0), nil), "an intent below the latest")

	wantConflict(t, s.Write(ctx, claimRecord("a1", "act", 5), nil), "a new intent of a stored key")
	anon := claimRecord("n1", "", 0)
	require.NoError(t, s.Write(ctx, anon, nil), "an intent of no action")
	if ce := wantConflict(t, s.Write(ctx, claimRecord("n1", "", 0), nil), "a new intent of a stored key of no action"); ce != nil && !persist.SameVersion(ce.Current, anon) {
		t.Errorf("lost write names %+v, want the stored n1", ce.Current)
	}
	require.NoError(t, s.Write(ctx, claimRecord("a2", "act", 2), nil), "the next seq")
	assert.Equal(t, uint64(2), stored(t, s, "a2").Seq, "the written record's seq")
}

// testNewIntentOneWinner: two writers racing to make an action's next
// intent (each with its own key, the same seq): exactly one wins.
func testNewIntentOneWinner(t *testing.T, s persist.Store) {
	ctx := context.Background()
	for round := range 10 {
		name := fmt.Sprintf("act-%d", round)
		const racers = 4
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := 0
		for i := range racers {
			wg.Go(func() {
				err := s.Write(ctx, claimRecord(fmt.Sprintf("%s-r%d", name, i), name, 1), nil)
				if err != nil && !errors.As(err, new(*persist.ConflictError)) {
					t.Errorf("write: %v", err)
				}
				if err == nil {
					mu.Lock()
					won++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		assert.Equal(t, 1, won, "writers of %s's next intent that won", name)
		wantLen(t, listed(t, s, persist.Filter{Name: name}), 1)
	}
}

// testWriteIfVersion: a record is changed or deleted only while it is the
// version the caller read; a changed record (another Holder) or a gone
// one refuses, and a refused change writes nothing.
func testWriteIfVersion(t *testing.T, s persist.Store) {
	ctx := context.Background()
	armed := claimRecord("h1", "act", 1)
	armed.Holder = "client-a"
	require.NoError(t, s.Write(ctx, armed, nil), "arm")
	read := stored(t, s, "h1")

	taken := next(read)
	taken.Holder, taken.UpdatedAt = "client-b", read.UpdatedAt.Add(time.Second)
	require.NoError(t, s.Write(ctx, taken, read), "take over the version read")

	again := next(read)
	again.Holder = "client-c"
	wantConflict(t, s.Write(ctx, again, read), "a stale version's change")
	wantConflict(t, s.Delete(ctx, read), "a stale version's delete")
	// Only the Rev tells versions apart: everything else of the stale
	// version is made equal to the stored one's.
	lookalike := taken.Clone()
	lookalike.Rev = read.Rev
	wantConflict(t, s.Write(ctx, next(lookalike), lookalike), "a version equal but for its Rev")
	got := stored(t, s, "h1")
	assert.Equal(t, "client-b", got.Holder, "holder after refused changes")
	if ce := wantConflict(t, s.Delete(ctx, read)); ce != nil && !persist.SameVersion(ce.Current, taken) {
		t.Errorf("refusal names %+v as the stored record, want client-b's", ce.Current)
	}

	require.NoError(t, s.Delete(ctx, got), "delete the stored version")
	_, err := s.Get(ctx, "h1")
	assert.ErrorIs(t, err, persist.ErrNotFound, "deleted")
	require.NoError(t, s.Delete(ctx, got), "deleting what is gone")
	if ce := wantConflict(t, s.Write(ctx, next(taken), got), "changing what is gone"); ce != nil && ce.Current != nil {
		t.Errorf("refusal names %+v as the stored record, want none", ce.Current)
	}
	_, err = s.Get(ctx, "h1")
	assert.ErrorIs(t, err, persist.ErrNotFound, "a refused change of a gone record writes nothing")
}

// testWriteIfVersionOneWinner: of two changes, or a change and a delete,
// racing for one version, exactly one wins.
func testWriteIfVersionOneWinner(t *testing.T, s persist.Store) {
	ctx := context.Background()
	for i := range 20 {
		rec := claimRecord(fmt.Sprintf("w%d", i), "act", uint64(i+1))
		rec.Holder = "client-a"
		require.NoError(t, s.Write(ctx, rec, nil))
		read := stored(t, s, rec.Key)
		taken := next(read)
		taken.Holder = "client-b"
		other := next(read)
		other.Holder = "client-c"
		var errA, errB error
		var wg sync.WaitGroup
		wg.Go(func() { errA = s.Write(ctx, taken, read) })
		if i%2 == 0 {
			wg.Go(func() { errB = s.Delete(ctx, read) })
		} else {
			wg.Go(func() { errB = s.Write(ctx, other, read) })
		}
		wg.Wait()
		if (errA == nil) == (errB == nil) {
			t.Fatalf("round %d: take-over: %v, rival: %v; want exactly one to win", i, errA, errB)
		}
		for _, err := range []error{errA, errB} {
			if err != nil {
				wantConflict(t, err, "the loser")
			}
		}
		got, err := s.Get(ctx, rec.Key)
		switch {
		case errA == nil:
			require.NoError(t, err, "taken over: still stored")
			if !persist.SameVersion(got, taken) {
				t.Errorf("round %d: stored %+v, want the winner's version", i, got)
			}
		case i%2 == 0:
			assert.ErrorIs(t, err, persist.ErrNotFound, "deleted: gone")
		default:
			require.NoError(t, err)
			if !persist.SameVersion(got, other) {
				t.Errorf("round %d: stored %+v, want the winner's version", i, got)
			}
		}
	}
}

// testVersionIsNew: a write without a Rev, or with the Rev of the version
// it replaces, is refused and writes nothing: such a write could not be
// recognised on re-read.
func testVersionIsNew(t *testing.T, s persist.Store) {
	ctx := context.Background()
	first := claimRecord("v1", "act", 1)
	first.Rev = ""
	assert.Error(t, s.Write(ctx, first, nil), "a new intent without a Rev")
	_, err := s.Get(ctx, "v1")
	assert.ErrorIs(t, err, persist.ErrNotFound, "nothing written")

	first.Rev = persist.NewRev()
	require.NoError(t, s.Write(ctx, first, nil))
	same := first.Clone()
	same.State = persist.StatePending
	assert.Error(t, s.Write(ctx, same, first), "a change that keeps the Rev it replaces")
	none := same.Clone()
	none.Rev = ""
	assert.Error(t, s.Write(ctx, none, first), "a change without a Rev")
	if got := stored(t, s, "v1"); !persist.SameVersion(got, first) || got.State != persist.StateNew {
		t.Errorf("refused changes wrote %+v", got)
	}
	other := claimRecord("v2", "act2", 1)
	assert.Error(t, s.Write(ctx, other, first), "a change written over another key's version")
	_, err = s.Get(ctx, "v2")
	assert.ErrorIs(t, err, persist.ErrNotFound, "nothing written")
}

// testUnknownResultRecognised: a writer that lost the answer of its
// Write (a crash, a timeout) tells by reading the record back whether it
// landed: the stored Rev is its own. Written again, the write is refused
// with its own version as the stored one; another writer's version is
// never taken for its own.
func testUnknownResultRecognised(t *testing.T, s persist.Store) {
	ctx := context.Background()
	v1 := claimRecord("u1", "act", 1)
	require.NoError(t, s.Write(ctx, v1, nil))

	v2 := next(v1)
	v2.State = persist.StatePending
	_ = s.Write(ctx, v2, v1) // the answer is lost
	assert.True(t, persist.SameVersion(stored(t, s, "u1"), v2), "the landed write is not recognised on re-read")
	ce := wantConflict(t, s.Write(ctx, v2, v1), "the write made again")
	if ce != nil && !persist.SameVersion(ce.Current, v2) {
		t.Errorf("the refusal holds %+v, want the writer's own version", ce.Current)
	}

	// Another writer moved it on: not this writer's version.
	v3 := next(stored(t, s, "u1"))
	v3.Holder = "other"
	require.NoError(t, s.Write(ctx, v3, v2))
	assert.False(t, persist.SameVersion(stored(t, s, "u1"), v2), "another writer's version is taken for this writer's")

	// A new intent whose write's answer was lost.
	n := claimRecord("u2", "act", 2)
	_ = s.Write(ctx, n, nil)
	assert.True(t, persist.SameVersion(stored(t, s, "u2"), n), "the landed new intent is not recognised on re-read")
	ce = wantConflict(t, s.Write(ctx, n, nil), "the new intent made again")
	if ce != nil && !persist.SameVersion(ce.Current, n) {
		t.Errorf("the refusal holds %+v, want the writer's own intent", ce.Current)
	}
}

// testDeferredWriteChecksAlike: a write that may be synced later
// (persist.WithDeferredSync) is checked as any other; the hint is about
// speed only.
func testDeferredWriteChecksAlike(t *testing.T, s persist.Store) {
	ctx := persist.WithDeferredSync(context.Background())
	v1 := claimRecord("d1", "act", 1)
	require.NoError(t, s.Write(ctx, v1, nil))
	wantConflict(t, s.Write(ctx, claimRecord("d2", "act", 1), nil), "a rival new intent")
	v2 := resolve(v1, base.Add(time.Minute))
	require.NoError(t, s.Write(ctx, v2, v1))
	stale := resolve(v1, base.Add(2*time.Minute))
	wantConflict(t, s.Write(ctx, stale, v1), "a stale version's change")
	AssertRecord(t, v2, stored(t, s, "d1"))
}
