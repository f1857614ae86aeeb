package persist_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// saveNamed saves a record for key and name, resolved or not, created at
// t0 plus i seconds, and returns it.
// namedSeq numbers the records saveNamed writes, so that each is above
// every earlier one of its Name.
var namedSeq atomic.Uint64

func saveNamed(t *testing.T, s persist.Store, key, name string, i int, resolved bool) *persist.Record {
	t.Helper()
	r := persisttest.NewRecord(key, t0.Add(time.Duration(i)*time.Second))
	r.Name, r.Seq = name, namedSeq.Add(1)
	if resolved {
		r.State = persist.StateSucceeded
		r.Response = &persist.Response{StatusCode: 201}
	}
	require.NoError(t, persisttest.Put(context.Background(), s, r))
	return r
}

// TestDamage: a file the store cannot read is reported, never repaired,
// and stops only the action it may belong to.
func TestDamage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"a damaged file is named, kept and stops nothing else", damageAnyWay},
		{"a damaged file blocks only its action", damageBlocksOnlyItsAction},
		{"a stray file blocks no action", damageStrayFile},
		{"two files of a key are damage of both actions", damageTwoFilesOfAKey},
		{"a second file of a key sorting first stops the paid action", damageSecondFileSortsFirst},
		{"Quarantine refuses what is not damaged and overwrites nothing", damageQuarantine},
		{"CorruptErrors finds every damaged record", damageCorruptErrors},
	} {
		t.Run(c.name, c.run)
	}
}

// damageBlocksOnlyItsAction damages one action's files and checks
// that List for another action neither fails nor reads them, while List for
// that action, and the zero Filter, report each with its path.
func damageBlocksOnlyItsAction(t *testing.T) {
	t.Parallel()
	for _, resolved := range []bool{false, true} {
		t.Run(fmt.Sprintf("resolved=%v", resolved), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dir := newDir(t)
			s, err := persist.OpenDir(dir, nil)
			require.NoError(t, err)
			saveNamed(t, s, "a-1", "checkout:a", 0, resolved)
			saveNamed(t, s, "b-1", "checkout:b", 1, true)
			b2 := saveNamed(t, s, "b-2", "checkout:b", 2, false)
			require.NoError(t, s.Close())
			path := filepath.Join(dir, persist.FileName("a-1", "checkout:a"))
			write(t, path, []byte(`{"version":1,"key":"a-1"`))

			s = openFile(t, dir, nil)
			recs, err := s.List(ctx, persist.Filter{Name: "checkout:b"})
			require.NoError(t, err, "another action's damaged file does not stop this one")
			assert.Equal(t, []string{"b-1", "b-2"}, keysOf(recs))
			recs, err = s.List(ctx, persist.Filter{Name: "checkout:b", Unresolved: true})
			require.NoError(t, err)
			persisttest.AssertRecord(t, b2, recs[0])

			_, err = s.List(ctx, persist.Filter{Name: "checkout:a"})
			var ce *persist.CorruptError
			require.ErrorAs(t, err, &ce, "the damaged file may hold this action's latest intent")
			assert.Equal(t, path, ce.Path)
			assert.Equal(t, "a-1", ce.Key)
			_, err = s.List(ctx, persist.Filter{})
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, path, ce.Path)
			_, err = s.List(ctx, persist.Filter{Unresolved: true})
			if resolved {
				assert.NoError(t, err, "the index held every unresolved intent: the damaged file held a resolved one")
			} else {
				assert.ErrorAs(t, err, &ce)
			}
		})
	}
}

func keysOf(recs []*persist.Record) []string {
	var keys []string
	for _, r := range recs {
		keys = append(keys, r.Key)
	}
	return keys
}

// damageStrayFile puts files in the store's directory whose names look
// like records' but spell no key: each is reported with its path and an
// empty key by List without a Name, blocks no action, and is moved aside
// by Quarantine.
func damageStrayFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	r := saveNamed(t, s, "k", "checkout:a", 0, false)
	require.NoError(t, s.Close())
	// The last two name a key but no action: "k2" spelled out, and a
	// hashed key.
	strays := []string{"k-!!.json", "h-1234.done.json", "k-00.zz.json", "k-dcp0.json", "h-" + strings.Repeat("ab", 32) + ".done.json"}
	for _, name := range strays {
		write(t, filepath.Join(dir, name), []byte("mine"))
	}

	s = openFile(t, dir, nil)
	recs, err := s.List(ctx, persist.Filter{})
	assert.Equal(t, []string{"k"}, keysOf(recs))
	cs := persist.CorruptErrors(err)
	require.Len(t, cs, len(strays))
	for _, ce := range cs {
		assert.Empty(t, ce.Key)
		assert.Contains(t, ce.Error(), ce.Path)
	}
	recs, err = s.List(ctx, persist.Filter{Name: "checkout:a"})
	require.NoError(t, err, "a stray file belongs to no action")
	assert.Len(t, recs, 1)
	_, err = s.List(ctx, persist.Filter{Unresolved: true})
	assert.Len(t, persist.CorruptErrors(err), len(strays), "a stray file may hold an unresolved intent")

	for _, ce := range cs {
		moved, err := s.Quarantine(ctx, ce.Path)
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(dir, "quarantine", filepath.Base(ce.Path)), moved)
		data, err := os.ReadFile(moved)
		require.NoError(t, err)
		assert.Equal(t, "mine", string(data), "moved as it was")
	}
	recs, err = s.List(ctx, persist.Filter{})
	require.NoError(t, err)
	persisttest.AssertRecord(t, r, recs[0])
	require.NoError(t, s.Close())
	s = openFile(t, dir, nil)
	_, err = s.List(ctx, persist.Filter{})
	require.NoError(t, err, "quarantined files are not read again")
}

// damageTwoFilesOfAKey puts a copy of a record's file under another
// action's tag beside it, which the store never writes. Neither file is
// trusted: each is damage of its own action, by either filter. Quarantine
// of one leaves the other as the key's record.
func damageTwoFilesOfAKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	a, b := "checkout:a", "checkout:b"
	if persist.FileName("k", a) > persist.FileName("k", b) {
		a, b = b, a
	}
	r := saveNamed(t, s, "k", a, 0, false)
	require.NoError(t, s.Close())
	own := filepath.Join(dir, persist.FileName("k", a))
	data, err := os.ReadFile(own)
	require.NoError(t, err)
	twin := filepath.Join(dir, persist.FileName("k", b))
	write(t, twin, data)

	check := func(s *persist.FileStore) {
		t.Helper()
		for _, f := range []persist.Filter{{}, {Unresolved: true}} {
			recs, err := s.List(ctx, f)
			assert.NotContains(t, keysOf(recs), "k", "neither file is taken for the key")
			assert.ElementsMatch(t, []string{own, twin}, corruptPaths(err))
		}
		for name, path := range map[string]string{a: own, b: twin} {
			recs, err := s.List(ctx, persist.Filter{Name: name})
			assert.Empty(t, recs)
			assert.Equal(t, []string{path}, corruptPaths(err), "each file stops its action")
		}
		_, err := s.Get(ctx, "k")
		var ce *persist.CorruptError
		require.ErrorAs(t, err, &ce)
		next := persisttest.NewRecord("k-new", t0.Add(time.Hour))
		next.Name, next.Seq, next.Rev = b, namedSeq.Add(1), persist.NewRev()
		require.Error(t, persist.Claim(ctx, s, next), "no new intent over a file that may be the action's")
	}
	s = openFile(t, dir, nil)
	check(s)
	// A change, so that Close writes the index again, with both files.
	other := saveNamed(t, s, "k2", "checkout:c", 1, true)
	require.NoError(t, s.Close())
	s = openFile(t, dir, nil)
	require.True(t, s.FromIndex())
	check(s)
	require.NoError(t, s.Delete(ctx, other))

	quarantined, err := s.Quarantine(ctx, twin)
	require.NoError(t, err)
	assert.FileExists(t, quarantined)
	_, err = s.Quarantine(ctx, own)
	require.Error(t, err, "the file left is the key's record, not damage")
	recs, err := s.List(ctx, persist.Filter{Name: a})
	require.NoError(t, err)
	require.Len(t, recs, 1)
	persisttest.AssertRecord(t, r, recs[0])
	require.NoError(t, s.Close())
	s = openFile(t, dir, nil)
	got, err := s.Get(ctx, "k")
	require.NoError(t, err)
	persisttest.AssertRecord(t, r, got)
}

// corruptPaths returns the Paths of err's *CorruptErrors.
func corruptPaths(err error) []string {
	var out []string
	for _, ce := range persist.CorruptErrors(err) {
		out = append(out, ce.Path)
	}
	return out
}

// damageQuarantine checks what Quarantine refuses, and that it never
// overwrites an earlier quarantined file.
func damageQuarantine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s := openFile(t, dir, nil)
	r := saveNamed(t, s, "k", "checkout:a", 0, false)
	good := filepath.Join(dir, persist.FileName("k", r.Name))
	for _, path := range []string{good, filepath.Join(dir, "nothing.json"), filepath.Join(dir, "quarantine")} {
		_, err := s.Quarantine(ctx, path)
		assert.ErrorContains(t, err, path)
		assert.ErrorContains(t, err, "nothing was moved")
	}
	assert.FileExists(t, good, "a readable record is never moved aside")

	var moved []string
	for i := range 3 {
		require.NoError(t, deleteKey(ctx, s, "k"))
		write(t, good, []byte(fmt.Sprint("damage ", i)))
		require.NoError(t, s.Close())
		s = openFile(t, dir, nil)
		_, err := s.Get(ctx, "k")
		var ce *persist.CorruptError
		require.ErrorAs(t, err, &ce)
		m, err := s.Quarantine(ctx, ce.Path)
		require.NoError(t, err)
		moved = append(moved, m)
		_, err = s.Get(ctx, "k")
		require.ErrorIs(t, err, persist.ErrNotFound, "the intent is gone from the store")
		require.NoError(t, persisttest.Put(ctx, s, r), "and can be saved again")
	}
	for i, m := range moved {
		data, err := os.ReadFile(m)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint("damage ", i), string(data), "quarantined copy %d kept", i)
	}
	_, err := s.Quarantine(context.Background(), moved[0])
	assert.Error(t, err)
	fi, err := os.Stat(filepath.Join(dir, "quarantine"))
	require.NoError(t, err)
	if runtime.GOOS != "windows" {
		assert.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "the quarantine directory")
	}
}

// damageCorruptErrors checks that CorruptErrors finds every damaged record
// List joined, where errors.As finds only the first, also when the error
// is wrapped again.
func damageCorruptErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	var paths []string
	for i, k := range []string{"a", "b", "c", "d"} {
		saveNamed(t, s, k, "checkout", i, false)
		if k != "c" {
			paths = append(paths, filepath.Join(dir, persist.FileName(k, "checkout")))
		}
	}
	require.NoError(t, s.Close())
	for _, p := range paths {
		write(t, p, nil)
	}
	s = openFile(t, dir, nil)
	recs, err := s.List(ctx, persist.Filter{Unresolved: true})
	assert.Equal(t, []string{"c"}, keysOf(recs))
	wrapped := fmt.Errorf("starting: %w", err)
	var got []string
	for _, ce := range persist.CorruptErrors(wrapped) {
		got = append(got, ce.Path)
	}
	assert.ElementsMatch(t, paths, got)
	var first *persist.CorruptError
	require.ErrorAs(t, wrapped, &first)
	assert.Nil(t, persist.CorruptErrors(nil))
	assert.Nil(t, persist.CorruptErrors(errors.New("other")))
	one := &persist.CorruptError{Path: "p"}
	assert.Equal(t, []*persist.CorruptError{one}, persist.CorruptErrors(one))
}

// TestFileLockSurvivesRemovedLockFile removes every lock file the store may
// have made while it is open: a second OpenDir is still refused.
func TestFileLockSurvivesRemovedLockFile(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	s := openFile(t, dir, nil)
	err := os.Remove(filepath.Join(dir, "LOCK"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Skipf("the lock file cannot be removed while held here: %v", err)
	}
	_, err = persist.OpenDir(dir, nil)
	assert.ErrorIs(t, err, persist.ErrLocked)
	require.NoError(t, s.Close())
	s2, err := persist.OpenDir(dir, nil)
	require.NoError(t, err, "Close releases the lock")
	require.NoError(t, s2.Close())
}

// damageAnyWay damages one record file in many ways and checks that the
// store names the file and the key, still loads the others, and neither
// deletes nor overwrites the damaged file unless told to.
func damageAnyWay(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("L", 200) // stored under a hashed name
	victims := []string{"victim", long}
	tests := []struct {
		name   string
		damage func(t *testing.T, path string, good []byte) // good is the file as saved
		newer  bool
	}{
		{"truncated", func(t *testing.T, path string, good []byte) { write(t, path, good[:len(good)/2]) }, false},
		{"truncated by one byte", func(t *testing.T, path string, good []byte) { write(t, path, good[:len(good)-2]) }, false},
		{"empty", func(t *testing.T, path string, _ []byte) { write(t, path, nil) }, false},
		{"zeros", func(t *testing.T, path string, good []byte) { write(t, path, make([]byte, len(good))) }, false},
		{"garbage", func(t *testing.T, path string, _ []byte) { write(t, path, []byte("\x00\xffnot json")) }, false},
		{"invalid record", func(t *testing.T, path string, good []byte) {
			write(t, path, []byte(strings.Replace(string(good), `"method":"POST"`, `"method":""`, 1)))
		}, false},
		{"no version", func(t *testing.T, path string, good []byte) {
			write(t, path, []byte(strings.Replace(string(good), `"version":1`, `"version":0`, 1)))
		}, false},
		{"newer version", func(t *testing.T, path string, good []byte) {
			write(t, path, []byte(strings.Replace(string(good), `"version":1`, `"version":2`, 1)))
		}, true},
		{"newer version, changed types", func(t *testing.T, path string, _ []byte) {
			write(t, path, []byte(`{"version":7,"key":{"id":1},"state":3}`))
		}, true},
		{"key of another file", func(t *testing.T, path string, _ []byte) {
			other, err := os.ReadFile(filepath.Join(filepath.Dir(path), persist.FileName("good-1", recName("good-1"))))
			require.NoError(t, err)
			write(t, path, other)
		}, false},
		{"directory", func(t *testing.T, path string, _ []byte) {
			require.NoError(t, os.Remove(path))
			require.NoError(t, os.Mkdir(path, 0o700))
		}, false},
	}
	for _, tt := range tests {
		for _, victim := range victims {
			t.Run(tt.name+"/"+victim[:min(len(victim), 8)], func(t *testing.T) {
				t.Parallel()
				testCorrupt(t, victim, tt.damage, tt.newer)
			})
		}
	}
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

func testCorrupt(t *testing.T, victim string, damage func(*testing.T, string, []byte), newer bool) {
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	for i, k := range []string{"good-0", victim, "good-1"} {
		require.NoError(t, persisttest.Put(ctx, s, persisttest.NewRecord(k, t0.Add(time.Duration(i)*time.Second))))
	}
	require.NoError(t, s.Close())
	path := filepath.Join(dir, persist.FileName(victim, recName(victim)))
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	damage(t, path, good)
	damaged, _ := os.ReadFile(path)

	s = openFile(t, dir, nil)
	recs, err := s.List(ctx, persist.Filter{})
	require.Error(t, err)
	var ce *persist.CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, path, ce.Path)
	assert.ErrorContains(t, err, path, "the error names the file")
	if len(victim) <= 150 {
		assert.Equal(t, victim, ce.Key, "the key is known from the file name")
		assert.ErrorContains(t, err, victim, "the error names the intent")
	}
	assert.Equal(t, newer, errors.Is(err, persist.ErrNewerVersion), "newer version: %v", err)
	assert.NotContains(t, err.Error(), "\n", "one line")
	var keys []string
	for _, r := range recs {
		keys = append(keys, r.Key)
	}
	assert.Equal(t, []string{"good-0", "good-1"}, keys, "the other records load")
	unresolved, err := s.List(ctx, persist.Filter{Unresolved: true})
	assert.ErrorAs(t, err, &ce, "List reports the damage whatever the filter")
	assert.Len(t, unresolved, 2)

	_, err = s.Get(ctx, victim)
	assert.ErrorAs(t, err, &ce, "Get")
	err = persisttest.Put(ctx, s, persisttest.NewRecord(victim, t0))
	assert.ErrorAs(t, err, &ce, "Save refuses to replace an unreadable record")
	n, err := persist.PruneFunc(ctx, s, updatedBefore(t0.Add(1000*time.Hour)))
	assert.ErrorAs(t, err, &ce, "Prune reports the damage")
	assert.Zero(t, n)
	after, _ := os.ReadFile(path)
	assert.Equal(t, damaged, after, "the damaged file is left as it was")

	assert.ErrorAs(t, s.Delete(ctx, &persist.Record{Key: victim, Rev: "any"}), &ce, "Delete refuses an unreadable record: it has no version to compare")
	after, _ = os.ReadFile(path)
	assert.Equal(t, damaged, after, "the damaged file is left as it was")
	_, err = s.Quarantine(ctx, path)
	require.NoError(t, err, "Quarantine moves it aside")
	_, err = os.Lstat(path)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = s.List(ctx, persist.Filter{})
	assert.NoError(t, err)
	assert.NoError(t, persisttest.Put(ctx, s, persisttest.NewRecord(victim, t0)), "and then it can be saved")
}

// damageSecondFileSortsFirst: "one bad file
// stops only the action it may belong to" - and so it must stop that
// action: a List for an action must return its records or report the
// damaged files tagged with its name. Otherwise the action looks never
// paid and a new intent of it is claimed.
//
// The path that failed: key K is action B's latest intent, paid
// (k-K.<tagB>.json). A second file of K appears whose name sorts first
// (k-K.<tagA>.json: copied or restored in, or left by the previous
// build's cut-short change of Name, whose rule was that the greater name
// holds the record). list() gives K's id to the first file in name order
// and makes B's own file a "twin" with an empty parsed name, so
// mayHold(Filter{Name: B}) is false for it: List{Name: B} returns no
// record and no *CorruptError, and Claim of a new intent of B, checked by
// the same selectLocked, succeeds.
func damageSecondFileSortsFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const key = "k-paid-1"
	paid := persisttest.NewRecord(key, t0)
	paid.Name, paid.Seq = "checkout:B", 1
	paid.State, paid.Response = persist.StateSucceeded, &persist.Response{StatusCode: 201}
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	require.NoError(t, persisttest.Put(ctx, s, paid))
	require.NoError(t, s.Close())
	own := filepath.Base(fileOfKey(t, dir, key))

	// The same key under another action's name, sorting before B's file.
	var name string
	var data []byte
	for i := 0; ; i++ {
		older := persisttest.NewRecord(key, t0)
		older.Name, older.Seq = "checkout:A-"+string(rune('a'+i%26))+string(rune('a'+i/26)), 1
		name, data = fileNameFor(t, older)
		if name < own {
			break
		}
		require.Less(t, i, 200)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))

	s, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	defer s.Close()
	got, lerr := s.List(ctx, persist.Filter{Name: "checkout:B"})
	if len(got) == 0 && lerr == nil {
		t.Errorf("List{Name: B} returns no record and no error: B's paid intent (%s) is taken for a stray second file of %s, which only an unfiltered List reports", own, name)
	}
	next := persisttest.NewRecord("k-new-2", t0.Add(time.Minute))
	next.Name, next.Seq = "checkout:B", 1
	next.Rev = persist.NewRev()
	if err := persist.Claim(ctx, s, next); err == nil {
		t.Errorf("Claim of a new intent of B (Seq 1, over B's paid intent of Seq 1) succeeded: the app pays B again")
	}
}

// fileOfKey returns the path of the one record file of key in dir.
func fileOfKey(t *testing.T, dir, key string) string {
	t.Helper()
	for _, n := range dirNames(t, dir) {
		if filepath.Ext(n) != ".json" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		if bytes.Contains(data, []byte(`"key":"`+key+`"`)) {
			return filepath.Join(dir, n)
		}
	}
	t.Fatalf("no file for key %q in %s", key, dir)
	return ""
}

// fileNameFor returns the name of the file a FileStore gives rec, by
// saving it in a store of its own in a fresh directory, and that file's
// content.
func fileNameFor(t *testing.T, rec *persist.Record) (string, []byte) {
	t.Helper()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	require.NoError(t, persisttest.Put(context.Background(), s, rec.Clone()))
	require.NoError(t, s.Close())
	path := fileOfKey(t, dir, rec.Key)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return filepath.Base(path), data
}
