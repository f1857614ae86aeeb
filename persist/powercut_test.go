package persist_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/long"
	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/internal/fsys"
)

// The power-cut test runs the file store on strictFS, a file system that
// forgets at a power cut everything that was not synced (and may keep a
// prefix of a directory's unsynced changes, or part of a file's unsynced
// data). Each seed opens a store, runs random saves, deletes and prunes
// until the power goes after a random number of file system changes
// (during OpenDir too), restarts, reopens the store and checks every key:
//
//   - a record whose Save returned nil, or an absence whose Delete or Prune
//     returned nil, is what the key holds, unless the operation cut short
//     by the power (the only one that did not return) left its own version;
//   - every record read is a whole version that some Save wrote: no file is
//     damaged, none half-written, none an older version come back.
//
// It repeats for powerCutsPerSeed cuts per seed, the store reopened on what
// the last cut left.
const (
	powerCutsEnv     = "IDEM_POWERCUTS"     // power cuts to run; default 1,000 (10,000 with IDEM_LONG=1, unless -short or -race)
	powerCutSeedEnv  = "IDEM_POWERCUT_SEED" // run this seed alone
	powerCutsPerSeed = 10
	powerDir         = "/data/idem/store"
)

var (
	powerKeys  = []string{"k0", "k1", "k2", "k3", "k4", strings.Repeat("long-key-", 20)}
	powerNames = []string{"checkout:a", "checkout:b"}
	allStates  = []persist.State{persist.StateNew, persist.StatePending, persist.StateExpired,
		persist.StateSucceeded, persist.StateFailed, persist.StateRejected, persist.StateVoid}
)

// TestPowerCut: a power cut at any point of the store's work loses no
// saved record and changes none. A file system that forgets what was not
// synced (strictFS) cuts the power.
func TestPowerCut(t *testing.T) {
	t.Parallel()
	t.Run("no saved record is lost or changed", powerCuts)
	t.Run("each dropped step of the durability scheme is caught", powerCutCatchesMutants)
	t.Run("a seed replays the same cuts", powerCutIsDeterministic)
	t.Run("a cut in a Quarantine loses no file", powerCutQuarantine)
}

// powerCuts runs the seeds of the power-cut test, or the one seed named
// by powerCutSeedEnv.
func powerCuts(t *testing.T) {
	t.Parallel()
	if s := os.Getenv(powerCutSeedEnv); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", powerCutSeedEnv, s, err)
		}
		if err := runPowerCuts(seed, powerCutsPerSeed, nil); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		return
	}
	// The 9,000 cuts past the first 1,000 are an extra seed range: they
	// run with IDEM_LONG=1, which CI sets. The race detector makes each
	// cut ten times slower, so its run keeps 1,000.
	cuts := 1_000
	if long.Enabled() && !testing.Short() && !raceEnabled {
		cuts = 10_000
	}
	if s := os.Getenv(powerCutsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", powerCutsEnv, s, err)
		}
		cuts = n
	}
	start := time.Now()
	seeds := uint64((cuts + powerCutsPerSeed - 1) / powerCutsPerSeed)
	for seed := uint64(1); seed <= seeds; seed++ {
		if err := runPowerCuts(seed, powerCutsPerSeed, nil); err != nil {
			t.Fatalf("seed %d: %v\nrerun: %s=%d go test ./persist -run 'TestPowerCut/^no_saved_record_is_lost_or_changed$' -count=1 -v",
				seed, err, powerCutSeedEnv, seed)
		}
	}
	t.Logf("%d power cuts (%d seeds) in %v; opened from the index: %d of the reopens after a cut, %d other opens",
		seeds*powerCutsPerSeed, seeds, time.Since(start).Round(time.Millisecond), indexOpens.Load(), indexEpochs.Load())
	if seeds >= 10 && (indexOpens.Load() == 0 || indexEpochs.Load() == 0) {
		t.Errorf("the test never opens the store from its index after a cut, or never otherwise: it does not test the index")
	}
}

// indexOpens and indexEpochs count the opens that started from the
// store's index: the reopens after a power cut, and the other opens.
var indexOpens, indexEpochs atomic.Int64

// powerCutCatchesMutants runs the power-cut test on a file system that
// drops one step of the durability scheme, and fails if the test does not
// notice within the default budget.
func powerCutCatchesMutants(t *testing.T) {
	t.Parallel()
	mutants := []struct {
		name string
		wrap func(fsys.FS) fsys.FS
	}{
		{"no directory sync after rename", func(f fsys.FS) fsys.FS { return &mutantFS{FS: f, dropSyncAfterRename: true} }},
		{"no file sync before rename", func(f fsys.FS) fsys.FS { return &mutantFS{FS: f, dropFileSync: true} }},
		{"no parent sync after mkdir", func(f fsys.FS) fsys.FS { return &mutantFS{FS: f, dropSyncAfterMkdir: true} }},
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			const budget = 10_000
			for seed := uint64(1); seed*powerCutsPerSeed <= budget; seed++ {
				if err := runPowerCuts(seed, powerCutsPerSeed, m.wrap); err != nil {
					t.Logf("killed by seed %d (%d power cuts): %v", seed, seed*powerCutsPerSeed, firstLine(err))
					return
				}
			}
			t.Errorf("the mutant %q survived %d power cuts", m.name, budget)
		})
	}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// mutantFS drops one step of the durability scheme.
type mutantFS struct {
	fsys.FS
	dropSyncAfterRename bool
	dropFileSync        bool
	dropSyncAfterMkdir  bool
	last                string // the last call that changed something
}

func (m *mutantFS) Rename(o, n string) error { m.last = "rename"; return m.FS.Rename(o, n) }
func (m *mutantFS) Remove(p string) error    { m.last = "remove"; return m.FS.Remove(p) }
func (m *mutantFS) Mkdir(p string, perm os.FileMode) error {
	m.last = "mkdir"
	return m.FS.Mkdir(p, perm)
}
func (m *mutantFS) Lock(p string) (io.Closer, error) { m.last = "lock"; return m.FS.Lock(p) }

func (m *mutantFS) SyncDir(p string) error {
	last := m.last
	m.last = "syncdir"
	if m.dropSyncAfterRename && last == "rename" || m.dropSyncAfterMkdir && last == "mkdir" {
		return nil
	}
	return m.FS.SyncDir(p)
}

func (m *mutantFS) CreateTemp(dir, pattern string) (fsys.File, error) {
	m.last = "create"
	f, err := m.FS.CreateTemp(dir, pattern)
	if err != nil || !m.dropFileSync {
		return f, err
	}
	return noSync{f}, nil
}

type noSync struct{ fsys.File }

func (noSync) Sync() error { return nil }

// powerRun is one seed's run: the file system, the model of what each key
// may hold, and a log of the operations for the failure message.
type powerRun struct {
	rng  *rand.Rand
	mem  *strictFS
	fsy  fsys.FS
	norm persist.Store // gives each version in the form a store keeps
	// acked is what each key holds as far as the store has said: a record,
	// or nil (absent). pending are the versions the one operation cut short
	// may have left instead (nil: absent).
	acked   map[string]*persist.Record
	pending map[string][]*persist.Record
	// undone are the versions a SaveDeferred that returned replaced, which
	// a power loss before its directory sync may bring back.
	undone map[string][]*persist.Record
	op     int
	log    []string
}

func runPowerCuts(seed uint64, cuts int, wrap func(fsys.FS) fsys.FS) error {
	_, err := runPowerCutsState(seed, cuts, wrap)
	return err
}

// runPowerCutsState runs the seed and returns the log of its last
// operations and the file system it left, for powerCutIsDeterministic.
func runPowerCutsState(seed uint64, cuts int, wrap func(fsys.FS) fsys.FS) (string, error) {
	r := &powerRun{
		rng:     rand.New(rand.NewPCG(seed, 0x1de3)),
		mem:     newStrictFS(),
		norm:    persist.NewMemory(nil),
		acked:   map[string]*persist.Record{},
		pending: map[string][]*persist.Record{},
		undone:  map[string][]*persist.Record{},
	}
	r.fsy = r.mem
	if wrap != nil {
		r.fsy = wrap(r.mem)
	}
	for cut := range cuts {
		r.mem.CutAfter(r.rng.IntN(80))
		if err := r.epoch(); err != nil {
			return "", r.fail(cut, err)
		}
		r.logf("-- power cut %d after %d file system changes in all", cut, r.mem.Changes())
		r.mem.Restart(r.rng)
		if err := r.verify(); err != nil {
			return "", r.fail(cut, err)
		}
		// verify opened the store and closed it: no temporary file of
		// a save or an index write cut short is left.
		des, _ := r.mem.ReadDir(powerDir)
		for _, de := range des {
			if strings.HasPrefix(de.Name(), ".tmp-") {
				return "", r.fail(cut, fmt.Errorf("%s/%s was left after a reopen", powerDir, de.Name()))
			}
		}
	}
	return strings.Join(r.log, "\n") + "\n" + r.mem.String(), nil
}

// powerCutIsDeterministic runs seeds twice: the operations, the cuts
// and what the file system kept must be the same, so that a seed printed
// by a failure replays it.
func powerCutIsDeterministic(t *testing.T) {
	t.Parallel()
	seeds := uint64(50)
	if testing.Short() || raceEnabled {
		seeds = 5
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		a, err := runPowerCutsState(seed, powerCutsPerSeed, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := runPowerCutsState(seed, powerCutsPerSeed, nil)
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Fatalf("seed %d ran two ways:\n%s\n--- and ---\n%s", seed, a, b)
		}
	}
}

func (r *powerRun) fail(cut int, err error) error {
	return fmt.Errorf("power cut %d: %w\nlast operations:\n  %s\nfile system now:\n%s",
		cut, err, strings.Join(r.log, "\n  "), r.mem)
}

func (r *powerRun) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf(format, args...))
	if len(r.log) > 40 {
		r.log = r.log[1:]
	}
}

// epoch opens the store and runs operations until the power goes.
func (r *powerRun) epoch() error {
	s, err := persist.OpenDirFS(r.fsy, powerDir, nil)
	if err != nil {
		if r.mem.Off() {
			r.logf("open: cut short")
			return nil
		}
		return fmt.Errorf("OpenDir with the power on: %w", err)
	}
	// The store's background work (the directory syncs of SaveDeferred)
	// ends with the power, as a process does: Close, with the power off,
	// waits for it.
	defer s.Close()
	if s.FromIndex() {
		indexEpochs.Add(1)
	}
	for i := 0; !r.mem.Off(); i++ {
		if i == 1000 {
			return fmt.Errorf("the power cut never came")
		}
		if err := r.step(s); err != nil {
			return err
		}
	}
	return nil
}

// step runs one random operation on s and updates the model.
func (r *powerRun) step(s *persist.FileStore) error {
	ctx := context.Background()
	key := powerKeys[r.rng.IntN(len(powerKeys))]
	switch x := r.rng.IntN(20); {
	case x < 12:
		rec, want := r.version(key)
		r.pending[key] = append(r.pending[key], want)
		err := overwrite(ctx, s, rec)
		r.logf("save %.8s #%d %s %s: %v", key, rec.Attempts, rec.Name, rec.State, err)
		return r.done(err, key)
	case x < 16:
		rec, want := r.version(key)
		r.pending[key] = append(r.pending[key], want)
		prev, undone := r.acked[key], r.undone[key]
		err := overwrite(persist.WithDeferredSync(ctx), s, rec)
		r.logf("save deferred %.8s #%d %s %s: %v", key, rec.Attempts, rec.Name, rec.State, err)
		if err := r.done(err, key); err != nil {
			return err
		}
		if err == nil && prev != nil {
			// Until the directory sync, a power loss may leave the
			// version before, whole, or one that an earlier deferred
			// save replaced.
			r.undone[key] = append(undone, prev)
		}
		// The background sync runs alone, so that a seed replays the
		// same run; the power may go during it, which is the window
		// where the deferred save is not yet durable.
		if err == nil && s.WaitDeferred() && !r.mem.Off() {
			r.logf("deferred saves synced")
			clear(r.undone)
		}
		return nil
	case x < 19:
		r.pending[key] = append(r.pending[key], nil)
		err := deleteKey(ctx, s, key)
		r.logf("delete %.8s: %v", key, err)
		return r.done(err, key)
	default:
		before := time.Unix(int64(r.op-r.rng.IntN(20)), 0)
		var pruned []string
		for _, k := range powerKeys {
			if a := r.acked[k]; a != nil && a.State.Resolved() && a.UpdatedAt.Before(before) {
				pruned = append(pruned, k)
				r.pending[k] = append(r.pending[k], nil)
			}
		}
		n, err := persist.PruneFunc(ctx, s, updatedBefore(before))
		r.logf("prune before #%d: %d, %v", before.Unix(), n, err)
		if err == nil && n != len(pruned) {
			return fmt.Errorf("Prune deleted %d records, want %d", n, len(pruned))
		}
		return r.done(err, pruned...)
	}
}

// done updates the model after an operation on keys returned err.
func (r *powerRun) done(err error, keys ...string) error {
	if err != nil {
		if r.mem.Off() {
			return nil // cut short: its versions stay pending
		}
		return fmt.Errorf("an operation failed with the power on: %w", err)
	}
	for _, k := range keys {
		delete(r.undone, k) // a durable write of the key; SaveDeferred adds back
		p := r.pending[k]
		if v := p[len(p)-1]; v != nil {
			r.acked[k] = v
		} else {
			delete(r.acked, k)
		}
		delete(r.pending, k)
	}
	return nil
}

// version returns a new version of key's record, to save, and the form the
// store keeps of it.
func (r *powerRun) version(key string) (rec, want *persist.Record) {
	r.op++
	rec = &persist.Record{
		// A key keeps its Name: one of two, so that actions differ.
		Key: key, Name: powerNames[int(key[len(key)-1])%len(powerNames)],
		Method: "POST", URL: "https://api.example.com/v1/payments",
		// Sizes that vary, so a torn write shows.
		Body:        bytes.Repeat([]byte{'a' + byte(r.op%26)}, r.rng.IntN(600)),
		Fingerprint: strconv.Itoa(r.op),
		CreatedAt:   time.Unix(0, 0),
		UpdatedAt:   time.Unix(int64(r.op), 0),
		State:       allStates[r.rng.IntN(len(allStates))],
		Attempts:    r.op,
		// Above every earlier version, so that a new key's write is its
		// action's latest intent.
		Seq: uint64(r.op),
		Rev: fmt.Sprintf("rev-%d", r.op),
	}
	if rec.State.Resolved() {
		rec.Response = &persist.Response{StatusCode: 201, Body: []byte(`{"id":"` + strconv.Itoa(r.op) + `"}`)}
	}
	if err := overwrite(context.Background(), r.norm, rec); err != nil {
		panic(err)
	}
	want, err := r.norm.Get(context.Background(), key)
	if err != nil {
		panic(err)
	}
	return rec, want
}

// overwrite writes rec over the version s holds of its key, or as a new
// intent if it holds none.
func overwrite(ctx context.Context, s persist.Store, rec *persist.Record) error {
	cur, err := s.Get(ctx, rec.Key)
	if errors.Is(err, persist.ErrNotFound) {
		cur, err = nil, nil
	}
	if err != nil {
		return err
	}
	return s.Write(ctx, rec, cur)
}

// verify reopens the store after a restart and checks every key against
// the model; what it finds becomes the model, as it is now durable.
func (r *powerRun) verify() error {
	ctx := context.Background()
	s, err := persist.OpenDirFS(r.fsy, powerDir, nil)
	if err != nil {
		return fmt.Errorf("OpenDir after the restart: %w", err)
	}
	defer s.Close()
	if s.FromIndex() {
		indexOpens.Add(1)
	}
	// The unresolved records first, which an OpenDir from the index lists
	// without reading the directory: they must be those of the full list.
	unresolved, err := s.List(ctx, persist.Filter{Unresolved: true})
	if err != nil {
		return fmt.Errorf("List of unresolved records after the restart: %w", err)
	}
	all, err := s.List(ctx, persist.Filter{})
	if err != nil {
		return fmt.Errorf("a record is damaged after the restart: %w", err)
	}
	var want []*persist.Record
	for _, rec := range all {
		if !rec.State.Resolved() {
			want = append(want, rec)
		}
	}
	if !reflect.DeepEqual(unresolved, want) {
		return fmt.Errorf("the unresolved records listed (from the index: %v) are %s; the store holds %s",
			s.FromIndex(), describeAll(unresolved), describeAll(want))
	}
	found := map[string]*persist.Record{}
	for _, rec := range all {
		found[rec.Key] = rec
	}
	for _, k := range powerKeys {
		got := found[k]
		delete(found, k)
		ok := same(got, r.acked[k])
		for _, p := range r.pending[k] {
			ok = ok || same(got, p)
		}
		for _, u := range r.undone[k] {
			ok = ok || same(got, u)
		}
		if !ok {
			return fmt.Errorf("key %.8s holds %s; the store said %s (or, cut short: %s)",
				k, describe(got), describe(r.acked[k]), describeAll(r.pending[k]))
		}
		if got != nil {
			r.acked[k] = got
		} else {
			delete(r.acked, k)
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("records of unknown keys: %v", found)
	}
	clear(r.pending)
	clear(r.undone)
	return nil
}

// same reports whether a and b are the same version. Both are in the form
// a store keeps (times in UTC without monotonic readings, empty headers and
// bodies as nil), so they compare field by field.
func same(a, b *persist.Record) bool {
	if a == nil || b == nil {
		return a == b
	}
	return reflect.DeepEqual(a, b)
}

func describe(r *persist.Record) string {
	if r == nil {
		return "nothing"
	}
	return fmt.Sprintf("#%d (%s, %s, %d body bytes)", r.Attempts, r.Name, r.State, len(r.Body))
}

func describeAll(rs []*persist.Record) string {
	var out []string
	for _, r := range rs {
		out = append(out, describe(r))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// powerCutQuarantine cuts the power at every point of a Quarantine: the
// damaged file is afterwards in the store's directory or in quarantine (or
// in both), never lost; once Quarantine has returned nil it is in
// quarantine alone.
func powerCutQuarantine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	damaged := []byte(`{"version":1,"key":"bad"`)
	for cutAfter := range 12 {
		for seed := range uint64(20) {
			mem := newStrictFS()
			s, err := persist.OpenDirFS(mem, powerDir, nil)
			if err != nil {
				t.Fatal(err)
			}
			good, _ := (&powerRun{rng: rand.New(rand.NewPCG(seed, 0)), norm: persist.NewMemory(nil)}).version("good")
			if err := s.Write(ctx, good, nil); err != nil {
				t.Fatal(err)
			}
			name := persist.FileName("bad", "checkout:a")
			path, moved := powerDir+"/"+name, powerDir+"/quarantine/"+name
			f, err := mem.CreateTemp(powerDir, ".tmp-*")
			if err == nil {
				_, err = f.Write(damaged)
			}
			if err == nil {
				err = f.Sync()
			}
			if err == nil {
				err = f.Close()
			}
			if err == nil {
				err = mem.Rename(f.Name(), path)
			}
			if err == nil {
				err = mem.SyncDir(powerDir)
			}
			if err == nil {
				err = s.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			s, err = persist.OpenDirFS(mem, powerDir, nil)
			if err != nil {
				t.Fatal(err)
			}
			mem.CutAfter(cutAfter)
			_, qerr := s.Quarantine(ctx, path)
			if qerr != nil && !mem.Off() {
				t.Fatalf("cut after %d, seed %d: Quarantine with the power on: %v", cutAfter, seed, qerr)
			}
			mem.Restart(rand.New(rand.NewPCG(seed, 1)))

			inStore, inQuarantine := readIs(mem, path, damaged), readIs(mem, moved, damaged)
			switch {
			case !inStore && !inQuarantine:
				t.Fatalf("cut after %d, seed %d: the damaged file is lost\n%s", cutAfter, seed, mem)
			case qerr == nil && (inStore || !inQuarantine):
				t.Fatalf("cut after %d, seed %d: Quarantine returned, yet the file is in the store %v, in quarantine %v\n%s",
					cutAfter, seed, inStore, inQuarantine, mem)
			}
			s, err = persist.OpenDirFS(mem, powerDir, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Get(ctx, "good")
			if err != nil || got.Attempts != good.Attempts {
				t.Fatalf("cut after %d, seed %d: the good record: %v", cutAfter, seed, err)
			}
			_ = s.Close()
		}
	}
}

func readIs(f *strictFS, path string, want []byte) bool {
	got, err := f.ReadFile(path, math.MaxInt64)
	return err == nil && bytes.Equal(got, want)
}
