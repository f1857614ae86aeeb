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
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/persist"
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
		{"RoundTrip", testRoundTrip},
		{"Replace", testReplace},
		{"CopiesNotShared", testCopiesNotShared},
		{"ListOrder", testListOrder},
		{"ListFilters", testListFilters},
		{"ListByNameFollowsChanges", testListByNameFollowsChanges},
		{"NotFound", testNotFound},
		{"Delete", testDelete},
		{"Keys", testKeys},
		{"RejectsInvalid", testRejectsInvalid},
		{"Concurrent", testConcurrent},
		{"Prune", func(t *testing.T, s persist.Store) { testPrune(t, s) }},
		{"PruneGeneric", func(t *testing.T, s persist.Store) { testPrune(t, hidePruner{s}) }},
		{"Claim", testClaim},
		{"ClaimOneWinner", testClaimOneWinner},
		{"SaveIfDeleteIf", testSaveIfDeleteIf},
		{"SaveIfDeleteIfGeneric", func(t *testing.T, s persist.Store) { testSaveIfDeleteIf(t, hideSwapper{s}) }},
		{"SaveIfOneWinner", testSaveIfOneWinner},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// hidePruner hides a store's one-step pruning, so that persist.PruneFunc
// takes its generic path.
type hidePruner struct{ persist.Store }

// hideSwapper hides a store's one-step SaveIf and DeleteIf, so that
// persist.SaveIf and persist.DeleteIf take their generic path.
type hideSwapper struct{ persist.Store }

// base is the instant most of the suite's records are created at, in a zone
// other than UTC, so that a store that keeps the zone is not mistaken for one
// that returns a different instant.
var base = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("CET", 3600))

// NewRecord returns a valid, fully populated record for key, created at
// created, as the suite saves it. Tests of stores may use it too.
func NewRecord(key string, created time.Time) *persist.Record {
	return &persist.Record{
		Key:    key,
		Name:   "checkout:cart-42",
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

// resolve returns r moved to StateSucceeded with a response, updated at
// updated.
func resolve(r *persist.Record, updated time.Time) *persist.Record {
	r = r.Clone()
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
	if g := canonical(got); !reflect.DeepEqual(w, g) {
		t.Errorf("record %s:\n got  %s\n want %s", want.Key, show(g), show(w))
		return false
	}
	return true
}

// show returns r as JSON, for failure messages.
func show(r *persist.Record) string {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Sprintf("%+v", *r)
	}
	return string(b)
}

// msg formats the optional message of a check: a format and its
// arguments.
func msg(m []any) string {
	if len(m) == 0 {
		return "unexpected result"
	}
	if f, ok := m[0].(string); ok {
		return fmt.Sprintf(f, m[1:]...)
	}
	return fmt.Sprint(m...)
}

// must stops the test if err is not nil.
func must(t testing.TB, err error, m ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", msg(m), err)
	}
}

// check reports an error if err is not nil.
func check(t testing.TB, err error, m ...any) bool {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", msg(m), err)
		return false
	}
	return true
}

// wantErr reports an error if err does not match target (or, with a nil
// target, if err is nil).
func wantErr(t testing.TB, err, target error, m ...any) {
	t.Helper()
	if target == nil && err == nil {
		t.Errorf("%s: no error", msg(m))
	} else if target != nil && !errors.Is(err, target) {
		t.Errorf("%s: error %v, want one matching %v", msg(m), err, target)
	}
}

// selects reports whether f selects r, as List must: it meets each
// condition of f that is set.
func selects(f persist.Filter, r *persist.Record) bool {
	return (f.Name == "" || r.Name == f.Name) && (!f.Unresolved || !r.State.Resolved())
}

// wantConflict reports an error unless err is a *persist.ConflictError,
// which it returns.
func wantConflict(t testing.TB, err error, m ...any) *persist.ConflictError {
	t.Helper()
	var ce *persist.ConflictError
	if !errors.As(err, &ce) {
		t.Errorf("%s: error %v, want a *persist.ConflictError", msg(m), err)
	}
	return ce
}

// wantKeys reports an error if got does not hold the keys want, in order.
func wantKeys(t testing.TB, got []*persist.Record, want []string, m ...any) {
	t.Helper()
	if k := keys(got); !slices.Equal(k, want) && (len(k) > 0 || len(want) > 0) {
		t.Errorf("%s: keys %q, want %q", msg(m), k, want)
	}
}

// wantLen stops the test if got does not hold n records.
func wantLen(t testing.TB, got []*persist.Record, n int, m ...any) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%s: %d records %q, want %d", msg(m), len(got), keys(got), n)
	}
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
		must(t, s.Save(ctx, r), "save %s", r.Key)
	}
	for _, r := range recs {
		got, err := s.Get(ctx, r.Key)
		must(t, err, "get %s", r.Key)
		AssertRecord(t, r, got)
		if !got.CreatedAt.Equal(r.CreatedAt) {
			t.Errorf("CreatedAt of %s: %v, want %v", r.Key, got.CreatedAt, r.CreatedAt)
		}
	}
}

func testReplace(t *testing.T, s persist.Store) {
	ctx := context.Background()
	v1 := NewRecord("k1", base)
	v2 := resolve(v1, base.Add(time.Second))
	must(t, s.Save(ctx, v1))
	must(t, s.Save(ctx, v2))
	got, err := s.Get(ctx, "k1")
	must(t, err)
	AssertRecord(t, v2, got)
	all, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantKeys(t, all, []string{"k1"}, "one record per key")
}

func testCopiesNotShared(t *testing.T, s persist.Store) {
	ctx := context.Background()
	in := resolve(NewRecord("k1", base), base)
	want := in.Clone()
	must(t, s.Save(ctx, in))

	// Change everything the caller still holds.
	in.Header.Set("Content-Type", "changed")
	in.Body[0] = 'X'
	in.Response.Header.Set("Content-Type", "changed")
	in.Response.Body[0] = 'X'
	in.State = persist.StateFailed

	got, err := s.Get(ctx, "k1")
	must(t, err)
	AssertRecord(t, want, got)

	// Change what Get and List returned.
	got.Header.Set("Content-Type", "changed")
	got.Body[0] = 'X'
	got.Response.Body[0] = 'X'
	got.Response.Header["X-New"] = []string{"1"}
	listed, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantLen(t, listed, 1)
	AssertRecord(t, want, listed[0])
	listed[0].Header.Set("Content-Type", "changed")
	listed[0].Body[0] = 'X'

	again, err := s.Get(ctx, "k1")
	must(t, err)
	AssertRecord(t, want, again)
}

func testListOrder(t *testing.T, s persist.Store) {
	ctx := context.Background()
	empty, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantLen(t, empty, 0, "a new store lists nothing")

	// Saved out of order; b and c share a creation time and sort by key.
	saves := []struct {
		key string
		at  time.Duration
	}{{"d", 3 * time.Second}, {"c", time.Second}, {"a", 0}, {"e", -time.Hour}, {"b", time.Second}}
	for _, sv := range saves {
		must(t, s.Save(ctx, NewRecord(sv.key, base.Add(sv.at))))
	}
	got, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantKeys(t, got, []string{"e", "a", "b", "c", "d"})
}

func testListFilters(t *testing.T, s persist.Store) {
	ctx := context.Background()
	states := []persist.State{
		persist.StateNew, persist.StatePending, persist.StateSucceeded, persist.StateFailed,
		persist.StateRejected, persist.StateExpired, persist.StateVoid,
	}
	for i, st := range states {
		for _, name := range []string{"one", "two", ""} {
			r := NewRecord(fmt.Sprintf("%s-%s", name, st), base.Add(time.Duration(i)*time.Second))
			r.Name = name
			r.State = st
			must(t, s.Save(ctx, r))
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
			got, err := s.List(ctx, tt.filter)
			must(t, err)
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
// are renamed, replaced, deleted and pruned, whichever way each was done.
func testListByNameFollowsChanges(t *testing.T, s persist.Store) {
	ctx := context.Background()
	named := func(key, name string, st persist.State, at time.Duration) *persist.Record {
		r := NewRecord(key, base.Add(at))
		r.Name, r.State = name, st
		return r
	}
	list := func(name string, want ...string) {
		t.Helper()
		got, err := s.List(ctx, persist.Filter{Name: name})
		must(t, err)
		wantKeys(t, got, want)
	}
	must(t, s.Save(ctx, named("k1", "a", persist.StatePending, 0)))
	must(t, s.Save(ctx, named("k2", "a", persist.StateSucceeded, time.Second)))
	must(t, s.Save(ctx, named("k3", "a", persist.StateSucceeded, 2*time.Second)))
	list("a", "k1", "k2", "k3")

	// Saved again under another Name, or under none.
	must(t, s.Save(ctx, named("k1", "b", persist.StatePending, 0)))
	must(t, s.Save(ctx, named("k3", "", persist.StateSucceeded, 2*time.Second)))
	list("a", "k2")
	list("b", "k1")

	// Changed in one step, then deleted.
	old, err := s.Get(ctx, "k1")
	must(t, err)
	must(t, persist.SaveIf(ctx, s, named("k1", "a", persist.StateSucceeded, 0), old))
	list("a", "k1", "k2")
	list("b")
	must(t, s.Delete(ctx, "k2"))
	list("a", "k1")
	old, err = s.Get(ctx, "k1")
	must(t, err)
	must(t, persist.DeleteIf(ctx, s, old))
	list("a")

	// Claimed, then pruned.
	must(t, persist.Claim(ctx, s, named("k4", "c", persist.StateNew, 3*time.Second)))
	list("c", "k4")
	must(t, s.Save(ctx, named("k4", "c", persist.StateSucceeded, 3*time.Second)))
	_, err = persist.PruneFunc(ctx, s, func(r *persist.Record) bool { return r.Key == "k4" })
	must(t, err)
	list("c")
	must(t, persist.Claim(ctx, s, named("k5", "c", persist.StateNew, 4*time.Second)))
	list("c", "k5")
}

func testNotFound(t *testing.T, s persist.Store) {
	ctx := context.Background()
	got, err := s.Get(ctx, "absent")
	wantErr(t, err, persist.ErrNotFound)
	if got != nil {
		t.Errorf("Get of an absent key returned a record: %s", show(got))
	}
}

func testDelete(t *testing.T, s persist.Store) {
	ctx := context.Background()
	must(t, s.Save(ctx, NewRecord("k1", base)))
	must(t, s.Save(ctx, NewRecord("k2", base)))
	must(t, s.Delete(ctx, "k1"))
	_, err := s.Get(ctx, "k1")
	wantErr(t, err, persist.ErrNotFound, "deleted")
	check(t, s.Delete(ctx, "k1"), "deleting again")
	check(t, s.Delete(ctx, "never-saved"), "deleting an absent key")
	all, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantKeys(t, all, []string{"k2"}, "the other record stays")

	must(t, s.Save(ctx, NewRecord("k1", base)), "a deleted key can be saved again")
	_, err = s.Get(ctx, "k1")
	check(t, err)
}

// testKeys saves keys that a naive file store would turn into paths
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
		r := NewRecord(k, base.Add(time.Duration(i)*time.Second))
		must(t, s.Save(ctx, r), "save %q", k)
	}
	for i, k := range ks {
		got, err := s.Get(ctx, k)
		if check(t, err, "get %q", k) {
			AssertRecord(t, NewRecord(k, base.Add(time.Duration(i)*time.Second)), got)
		}
	}
	all, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantKeys(t, all, ks, "every key is its own record")
	for _, k := range ks {
		must(t, s.Delete(ctx, k), "delete %q", k)
	}
	all, err = s.List(ctx, persist.Filter{})
	must(t, err)
	wantLen(t, all, 0)
}

func testRejectsInvalid(t *testing.T, s persist.Store) {
	ctx := context.Background()
	good := NewRecord("k1", base)
	must(t, s.Save(ctx, good))
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good.Clone()
			tt.change(r)
			wantErr(t, r.Validate(), nil, "precondition: the record is invalid")
			wantErr(t, s.Save(ctx, r), nil)
		})
	}
	wantErr(t, s.Save(ctx, nil), nil, "nil record")
	got, err := s.Get(ctx, "k1")
	must(t, err)
	AssertRecord(t, good, got)
	all, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantKeys(t, all, []string{"k1"}, "no invalid record was stored")
}

// testConcurrent saves, reads and lists from many goroutines at once; run
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
				if err := s.Save(ctx, r); err != nil {
					errs <- err
					continue
				}
				if _, err := s.List(ctx, persist.Filter{Unresolved: true}); err != nil {
					errs <- err
				}
				if i%2 == 0 {
					if err := s.Save(ctx, resolve(r, r.CreatedAt.Add(time.Second))); err != nil {
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
		check(t, err)
	}
	all, err := s.List(ctx, persist.Filter{})
	must(t, err)
	wantLen(t, all, workers*perWorker)
	for _, r := range all {
		var w, i int
		_, err := fmt.Sscanf(r.Key, "w%d-%d", &w, &i)
		must(t, err)
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
		must(t, s.Save(ctx, r))
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

	// Aged: last updated (or, never updated, created) before the cutoff.
	aged := func(r *persist.Record) bool {
		if !r.State.Resolved() {
			t.Errorf("unresolved %s passed to drop", r.Key)
		}
		at := r.UpdatedAt
		if at.IsZero() {
			at = r.CreatedAt
		}
		return at.Before(cutoff)
	}
	n, err := persist.PruneFunc(ctx, s, aged)
	must(t, err)
	if n != 5 {
		t.Errorf("pruned %d, want 5", n)
	}
	left, err := s.List(ctx, persist.Filter{})
	must(t, err)
	slices.Sort(wantLeft)
	if got := slices.Sorted(slices.Values(keys(left))); !slices.Equal(got, wantLeft) {
		t.Errorf("left after pruning: %q, want %q", got, wantLeft)
	}

	n, err = persist.PruneFunc(ctx, s, aged)
	must(t, err)
	if n != 0 {
		t.Errorf("pruning again pruned %d", n)
	}
}

// claimRecord returns a record of action name with seq, unique by key.
func claimRecord(key, name string, seq uint64) *persist.Record {
	r := NewRecord(key, base)
	r.Name, r.Seq = name, seq
	return r
}

// testClaim: a claim wins only over records of its Name with lower Seq,
// and a lost one says which record is the latest and saves nothing.
func testClaim(t *testing.T, s persist.Store) {
	ctx := context.Background()
	must(t, persist.Claim(ctx, s, claimRecord("a1", "act", 1)), "first claim")
	must(t, persist.Claim(ctx, s, claimRecord("b1", "other", 1)), "another action's claim")

	err := persist.Claim(ctx, s, claimRecord("a1-rival", "act", 1))
	if ce := wantConflict(t, err, "a second claim of the same seq"); ce != nil && (ce.Current == nil || ce.Current.Key != "a1") {
		t.Errorf("lost claim names %+v as latest, want a1", ce.Current)
	}
	_, err = s.Get(ctx, "a1-rival")
	wantErr(t, err, persist.ErrNotFound, "a lost claim saves nothing")

	wantConflict(t, persist.Claim(ctx, s, claimRecord("a1", "act", 5)), "a claim of a stored key")
	must(t, persist.Claim(ctx, s, claimRecord("a2", "act", 2)), "the next seq")
	got, err := s.Get(ctx, "a2")
	must(t, err)
	if got.Seq != 2 {
		t.Errorf("claimed record has seq %d, want 2", got.Seq)
	}
}

// testClaimOneWinner: of claims racing for one seq, exactly one wins, if
// the store arbitrates claims (a Claim method, see persist.Store; the
// tests of package persist give its stores one).
func testClaimOneWinner(t *testing.T, s persist.Store) {
	if _, ok := s.(interface {
		Claim(context.Context, *persist.Record) error
	}); !ok {
		t.Skip("the store has no Claim method")
	}
	ctx := context.Background()
	const racers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range racers {
		wg.Go(func() {
			err := persist.Claim(ctx, s, claimRecord(fmt.Sprintf("r%d", i), "act", 1))
			if err != nil && !errors.As(err, new(*persist.ConflictError)) {
				t.Errorf("claim: %v", err)
			}
			if err == nil {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if won != 1 {
		t.Errorf("%d claims won, want 1", won)
	}
	recs, err := s.List(ctx, persist.Filter{Name: "act"})
	must(t, err)
	wantLen(t, recs, 1)
}

// testSaveIfDeleteIf: a record is changed or deleted only while it is the
// version the caller read; a taken-over record (another Holder) or a gone
// one refuses, and a refused change saves nothing.
func testSaveIfDeleteIf(t *testing.T, s persist.Store) {
	ctx := context.Background()
	armed := claimRecord("h1", "act", 1)
	armed.State, armed.Holder = persist.StateNew, "client-a"
	must(t, s.Save(ctx, armed), "arm")
	read, err := s.Get(ctx, "h1")
	must(t, err)

	taken := read.Clone()
	taken.Holder, taken.UpdatedAt = "client-b", read.UpdatedAt.Add(time.Second)
	must(t, persist.SaveIf(ctx, s, taken, read), "take over the version read")

	again := read.Clone()
	again.Holder = "client-c"
	wantConflict(t, persist.SaveIf(ctx, s, again, read), "a stale version's change")
	wantConflict(t, persist.DeleteIf(ctx, s, read), "a stale version's delete")
	got, err := s.Get(ctx, "h1")
	must(t, err, "a refused delete deletes nothing")
	if got.Holder != "client-b" {
		t.Errorf("holder %q after refused changes, want client-b", got.Holder)
	}
	if ce := wantConflict(t, persist.DeleteIf(ctx, s, read)); ce != nil && (ce.Current == nil || ce.Current.Holder != "client-b") {
		t.Errorf("refusal names %+v as the stored record, want client-b's", ce.Current)
	}

	must(t, persist.DeleteIf(ctx, s, got), "delete the stored version")
	_, err = s.Get(ctx, "h1")
	wantErr(t, err, persist.ErrNotFound, "deleted")
	must(t, persist.DeleteIf(ctx, s, got), "deleting what is gone")
	if ce := wantConflict(t, persist.SaveIf(ctx, s, taken, got), "changing what is gone"); ce != nil && ce.Current != nil {
		t.Errorf("refusal names %+v as the stored record, want none", ce.Current)
	}
	_, err = s.Get(ctx, "h1")
	wantErr(t, err, persist.ErrNotFound, "a refused change of a gone record saves nothing")
}

// testSaveIfOneWinner: of a take-over and a delete racing for one
// version, exactly one wins, if the store arbitrates them (SaveIf and
// DeleteIf methods, see persist.Store).
func testSaveIfOneWinner(t *testing.T, s persist.Store) {
	if _, ok := s.(interface {
		SaveIf(ctx context.Context, rec, old *persist.Record) error
		DeleteIf(ctx context.Context, old *persist.Record) error
	}); !ok {
		t.Skip("the store has no SaveIf and DeleteIf methods")
	}
	ctx := context.Background()
	for i := range 20 {
		rec := claimRecord(fmt.Sprintf("w%d", i), "act", uint64(i+1))
		rec.State, rec.Holder = persist.StateNew, "client-a"
		must(t, s.Save(ctx, rec))
		read, err := s.Get(ctx, rec.Key)
		must(t, err)
		taken := read.Clone()
		taken.Holder = "client-b"
		var saveErr, delErr error
		var wg sync.WaitGroup
		wg.Go(func() { saveErr = persist.SaveIf(ctx, s, taken, read) })
		wg.Go(func() { delErr = persist.DeleteIf(ctx, s, read) })
		wg.Wait()
		if (saveErr == nil) == (delErr == nil) {
			t.Fatalf("take-over: %v, delete: %v; want exactly one to win", saveErr, delErr)
		}
		_, err = s.Get(ctx, rec.Key)
		if saveErr == nil {
			must(t, err, "taken over: still stored")
		} else {
			wantErr(t, err, persist.ErrNotFound, "deleted: gone")
		}
	}
}
