package persist_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// recName is the Name of the record persisttest.NewRecord makes for key.
func recName(key string) string { return persisttest.NewRecord(key, t0).Name }

// newDir returns a directory for a store that does not exist yet:
// t.TempDir itself may have mode 0755, which OpenDir refuses.
func newDir(t testing.TB) string {
	return filepath.Join(t.TempDir(), "store")
}

// updatedBefore selects the records for PruneFunc last updated before t.
func updatedBefore(t time.Time) func(*persist.Record) bool {
	return func(r *persist.Record) bool { return r.UpdatedAt.Before(t) }
}

// openFile opens a FileStore in dir and closes it when the test ends.
func openFile(t testing.TB, dir string, opts *persist.Options) *persist.FileStore {
	t.Helper()
	s, err := persist.OpenDir(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func TestFileConformance(t *testing.T) {
	t.Parallel()
	persisttest.Run(t, func(t *testing.T) persist.Store { return openFile(t, newDir(t), nil) })
}

func TestFileReopen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	want := []*persist.Record{persisttest.NewRecord("a", t0), persisttest.NewRecord("b", t0.Add(time.Second))}
	want[1].State, want[1].Response = persist.StateFailed, &persist.Response{StatusCode: 402, Body: []byte("no funds")}
	for _, r := range want {
		require.NoError(t, persisttest.Put(ctx, s, r))
	}
	require.NoError(t, s.Close())

	s = openFile(t, dir, nil)
	got, err := s.List(ctx, persist.Filter{})
	require.NoError(t, err)
	require.Len(t, got, 2)
	for i := range want {
		persisttest.AssertRecord(t, want[i], got[i])
	}
}

func TestFilePermissions(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no Unix permission bits")
	}
	t.Parallel()
	dir := filepath.Join(newDir(t), "a", "store")
	s := openFile(t, dir, nil)
	require.NoError(t, persisttest.Put(context.Background(), s, persisttest.NewRecord("k", t0)))

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "directory")
	for _, name := range []string{persist.FileName("k", recName("k")), "LOCK"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if name == "LOCK" && errors.Is(err, fs.ErrNotExist) {
			continue // the directory itself is locked
		}
		require.NoError(t, err)
		assert.Equal(t, fs.FileMode(0o600), fi.Mode().Perm(), name)
	}
}

func TestFileInsecureDir(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no Unix permission bits")
	}
	t.Parallel()
	for _, mode := range []fs.FileMode{0o750, 0o705, 0o777} {
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, mode))
		_, err := persist.OpenDir(dir, nil)
		assert.ErrorIs(t, err, persist.ErrInsecureDir, "mode %o", mode)
		assert.ErrorContains(t, err, dir)
		_, err = os.Stat(filepath.Join(dir, "LOCK"))
		assert.ErrorIs(t, err, fs.ErrNotExist, "nothing written into an insecure directory")
	}
}

func TestFileNotADirectory(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err := persist.OpenDir(path, nil)
	assert.ErrorContains(t, err, path)
	_, err = persist.OpenDir("", nil)
	assert.Error(t, err)
}

func TestFileLocked(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)

	_, err = persist.OpenDir(dir, nil)
	assert.ErrorIs(t, err, persist.ErrLocked)
	assert.ErrorContains(t, err, dir)

	require.NoError(t, s.Close())
	assert.NoError(t, s.Close(), "closing twice")
	openFile(t, dir, nil) // the lock was released
}

func TestFileClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := persist.OpenDir(newDir(t), nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.ErrorIs(t, persisttest.Put(ctx, s, persisttest.NewRecord("k", t0)), persist.ErrClosed)
	_, err = s.Get(ctx, "k")
	assert.ErrorIs(t, err, persist.ErrClosed)
	_, err = s.List(ctx, persist.Filter{})
	assert.ErrorIs(t, err, persist.ErrClosed)
	assert.ErrorIs(t, deleteKey(ctx, s, "k"), persist.ErrClosed)
	_, err = persist.PruneFunc(ctx, s, updatedBefore(t0))
	assert.ErrorIs(t, err, persist.ErrClosed)
}

// TestFileCloseWaits closes a store while saves run: each save either
// completes before the lock is released, and is there after reopening, or
// fails with ErrClosed.
func TestFileCloseWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = persisttest.Put(ctx, s, persisttest.NewRecord(fmt.Sprint(i), t0)) })
	}
	require.NoError(t, s.Close())
	wg.Wait()

	s = openFile(t, dir, nil)
	for i, err := range errs {
		if err != nil {
			assert.ErrorIs(t, err, persist.ErrClosed)
			continue
		}
		_, err := s.Get(ctx, fmt.Sprint(i))
		assert.NoError(t, err, "a save that returned nil before Close")
	}
}

func TestCanceledContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stores := map[string]persist.Store{"memory": persist.NewMemory(nil), "file": openFile(t, newDir(t), nil)}
	for name, s := range stores {
		assert.ErrorIs(t, persisttest.Put(ctx, s, persisttest.NewRecord("k", t0)), context.Canceled, name)
		_, err := s.Get(context.Background(), "k")
		assert.ErrorIs(t, err, persist.ErrNotFound, "%s: a canceled save stores nothing", name)
		_, err = s.Get(ctx, "k")
		assert.ErrorIs(t, err, context.Canceled, name)
		_, err = s.List(ctx, persist.Filter{})
		assert.ErrorIs(t, err, context.Canceled, name)
		assert.ErrorIs(t, deleteKey(ctx, s, "k"), context.Canceled, name)
		_, err = persist.PruneFunc(ctx, s, updatedBefore(t0))
		assert.ErrorIs(t, err, context.Canceled, name)
	}
}

func TestDiscardResponseBodies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	opts := &persist.Options{DiscardResponseBodies: true}
	stores := map[string]persist.Store{"memory": persist.NewMemory(opts), "file": openFile(t, dir, opts)}
	for name, s := range stores {
		r := persisttest.NewRecord("k", t0)
		r.State = persist.StateSucceeded
		r.Response = &persist.Response{StatusCode: 201, Header: map[string][]string{"X": {"1"}}, Body: []byte("secret-card-token"), Replayed: true}
		require.NoError(t, persisttest.Put(ctx, s, r))
		got, err := s.Get(ctx, "k")
		require.NoError(t, err)
		want := r.Clone()
		want.Response.Body = nil
		persisttest.AssertRecord(t, want, got)
		assert.Equal(t, []byte("secret-card-token"), r.Response.Body, "%s: the caller's record is not changed", name)
	}
	data, err := os.ReadFile(filepath.Join(dir, persist.FileName("k", recName("k"))))
	require.NoError(t, err)
	assert.NotContains(t, string(data), "secret", "the body is not on disk")
	assert.NotContains(t, string(data), "c2VjcmV0", "the body is not on disk in base64")
}

// TestFileCorrupt damages one record file in many ways and checks that the
// store names the file and the key, still loads the others, and neither
// deletes nor overwrites the damaged file unless told to.
func TestFileCorrupt(t *testing.T) {
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

func TestFileIgnoresOtherFiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	require.NoError(t, persisttest.Put(ctx, s, persisttest.NewRecord("k", t0)))
	require.NoError(t, s.Close())

	// What a crash leaves between writing a temporary file and renaming it,
	// and files that are none of the store's business.
	write(t, filepath.Join(dir, ".tmp-123456"), []byte(`{"version":1,"key":"half`))
	write(t, filepath.Join(dir, ".tmp-999"), nil)
	write(t, filepath.Join(dir, "notes.txt"), []byte("mine"))
	write(t, filepath.Join(dir, ".DS_Store"), []byte("\x00"))

	s = openFile(t, dir, nil)
	recs, err := s.List(ctx, persist.Filter{})
	require.NoError(t, err, "temporary and foreign files are not records")
	require.Len(t, recs, 1)
	names := dirNames(t, dir)
	assert.NotContains(t, names, ".tmp-123456", "stale temporary files are removed at open")
	assert.NotContains(t, names, ".tmp-999")
	assert.Contains(t, names, "notes.txt", "foreign files are left alone")
	assert.Contains(t, names, ".DS_Store")
}

// dirNames returns the names in dir but the lock file, which only some
// systems have.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, de := range des {
		if de.Name() != "LOCK" && de.Name() != "index" {
			names = append(names, de.Name())
		}
	}
	return names
}

// TestFileRenameFails makes the record's path a non-empty directory, so the
// final rename of a save fails: the save reports it and leaves no temporary
// file behind.
func TestFileRenameFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s := openFile(t, dir, nil)
	path := filepath.Join(dir, persist.FileName("k", recName("k")))
	require.NoError(t, os.MkdirAll(filepath.Join(path, "x"), 0o700))

	err := persisttest.Put(ctx, s, persisttest.NewRecord("k", t0))
	require.Error(t, err)
	assert.ErrorContains(t, err, path)
	assert.ErrorContains(t, err, `"k"`)
	_, err = s.Get(ctx, "k")
	assert.ErrorIs(t, err, persist.ErrNotFound, "a failed save stores nothing")
	for _, name := range dirNames(t, dir) {
		assert.False(t, strings.HasPrefix(name, ".tmp-"), "temporary file %s left behind", name)
	}
}

// TestFileSyncs checks the durability scheme's cost: two fsyncs per save
// (the file, the directory), also when the record becomes resolved, as its
// file keeps its name; none for a change of Name, refused; one per delete.
func TestFileSyncs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s := openFile(t, dir, nil)
	r := persisttest.NewRecord("k", t0)
	require.NoError(t, persisttest.Put(ctx, s, r))
	assert.Equal(t, int64(2), s.Syncs(), "after a save")
	r.Attempts = 1
	require.NoError(t, persisttest.Put(ctx, s, r))
	assert.Equal(t, int64(4), s.Syncs(), "after saving it again")
	r.State = persist.StateSucceeded
	require.NoError(t, persisttest.Put(ctx, s, r))
	assert.Equal(t, int64(6), s.Syncs(), "after saving it resolved")
	assert.Equal(t, []string{persist.FileName("k", recName("k"))}, dirNames(t, dir), "one file")
	r.Name = "refund:k"
	require.ErrorContains(t, persisttest.Put(ctx, s, r), "keeps its Name")
	assert.Equal(t, int64(6), s.Syncs(), "after refusing it under another Name")
	assert.Equal(t, []string{persist.FileName("k", recName("k"))}, dirNames(t, dir), "one file still")
	require.NoError(t, deleteKey(ctx, s, "k"))
	assert.Equal(t, int64(7), s.Syncs(), "after a delete")
	require.NoError(t, deleteKey(ctx, s, "k"))
	assert.Equal(t, int64(7), s.Syncs(), "deleting an absent key")
	assert.Equal(t, []string(nil), dirNames(t, dir))
}

// TestFileLazyResolved checks that after an open from the index the files
// of resolved records are read when first asked for, and that damage found
// then is reported as at open.
func TestFileLazyResolved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	for i, k := range []string{"a", "b", "c"} {
		r := persisttest.NewRecord(k, t0.Add(time.Duration(i)*time.Second))
		if k != "a" {
			r.State = persist.StateSucceeded
		}
		require.NoError(t, persisttest.Put(ctx, s, r))
	}
	require.NoError(t, s.Close())
	path := filepath.Join(dir, persist.FileName("b", recName("b")))
	write(t, path, []byte(`{"version":1,"key":"b"`))

	s = openFile(t, dir, nil)
	require.True(t, s.FromIndex())
	unresolved, err := s.List(ctx, persist.Filter{Unresolved: true})
	require.NoError(t, err, "the damaged resolved file is not read for this")
	assert.Len(t, unresolved, 1)
	_, err = s.Get(ctx, "c")
	require.NoError(t, err)
	all, err := s.List(ctx, persist.Filter{})
	var ce *persist.CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, path, ce.Path)
	assert.Equal(t, "b", ce.Key)
	assert.Len(t, all, 2)
	_, err = s.Get(ctx, "b")
	assert.ErrorAs(t, err, &ce)
	assert.ErrorAs(t, persisttest.Put(ctx, s, persisttest.NewRecord("b", t0)), &ce, "not replaced")
	unresolved, err = s.List(ctx, persist.Filter{Unresolved: true})
	assert.NoError(t, err, "the index held every unresolved record: the damaged file held a resolved one")
	assert.Len(t, unresolved, 1)
}
