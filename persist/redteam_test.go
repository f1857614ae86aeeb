package persist_test

// Red-team findings against the device store (persist.FileStore). Each test
// is named for the promise it breaks and fails while the finding stands.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// rtOpenWithin runs OpenDir(dir) and waits up to d for it. It returns the
// store and error, or ok false if OpenDir was still running; then unblock
// is called until OpenDir returns, so that nothing leaks.
func rtOpenWithin(t *testing.T, dir string, d time.Duration, unblock func()) (s *persist.FileStore, err error, ok bool) {
	t.Helper()
	type res struct {
		s   *persist.FileStore
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := persist.OpenDir(dir, nil)
		ch <- res{s, err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err, true
	case <-time.After(d):
	}
	for {
		unblock()
		select {
		case r := <-ch:
			if r.s != nil {
				_ = r.s.Close()
			}
			return nil, nil, false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// rtFeedFIFO opens the FIFO at path for writing without blocking, if a
// reader waits on it, and closes it at once: the reader gets EOF.
func rtFeedFIFO(path string) func() {
	return func() {
		fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			_ = syscall.Close(fd)
		}
	}
}

// TestOpenDirBoundedOnHostileDirectory_IndexIsNotARegularFile: a write or
// open must not spend unbounded time or memory on a damaged or hostile
// directory.
//
// Path to the failure: loadIndex Lstat-stamps "index" and then calls
// os.ReadFile on it with no check of its type (record files are checked
// with IsRegular, the index is not). An "index" that is a FIFO blocks
// OpenDir forever in open(2); one that is a symlink to /dev/zero (ReadFile
// follows it, though the stamp was taken with Lstat) makes OpenDir read
// and allocate without end. The app cannot start, and every intent in the
// store is out of reach.
func TestOpenDirBoundedOnHostileDirectory_IndexIsNotARegularFile(t *testing.T) {
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	rec := persisttest.NewRecord("pending-1", t0)
	require.NoError(t, persisttest.Put(ctx, s, rec))
	require.NoError(t, s.Close())

	idx := filepath.Join(dir, "index")
	require.FileExists(t, idx, "Close wrote the index")
	require.NoError(t, os.Remove(idx))
	require.NoError(t, syscall.Mkfifo(idx, 0o600))

	s, err, ok := rtOpenWithin(t, dir, 3*time.Second, rtFeedFIFO(idx))
	if !ok {
		t.Fatalf("OpenDir of a directory whose index is a FIFO did not return in 3s: it blocks in os.ReadFile of the index forever")
	}
	require.NoError(t, err)
	defer s.Close()
	got, err := s.List(ctx, persist.Filter{Unresolved: true})
	require.NoError(t, err)
	require.Len(t, got, 1)
}

// TestOpenDirBoundedOnHostileDirectory_IndexedFileReplaced: a write or
// open must not spend unbounded time or memory on a damaged or hostile
// directory; a file that is not a regular file is reported as damage
// ("not a regular file"), as a scan reports it.
//
// Path to the failure: an unresolved record is in the index with the
// type bits its file had (regular). The file is then replaced by a FIFO
// (or a symlink to one, or to /dev/zero). At OpenDir, useIndex sees the
// stamp changed and rereads the file through record(), which trusts the
// stale mode from the index instead of the file's type now, so it calls
// os.ReadFile on the FIFO and OpenDir blocks forever. Without the index
// (a scan), the same directory opens at once and the file is reported as
// a *CorruptError.
func TestOpenDirBoundedOnHostileDirectory_IndexedFileReplaced(t *testing.T) {
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	rec := persisttest.NewRecord("pending-1", t0)
	require.NoError(t, persisttest.Put(ctx, s, rec))
	other := persisttest.NewRecord("pending-2", t0.Add(time.Second))
	require.NoError(t, persisttest.Put(ctx, s, other))
	require.NoError(t, s.Close())
	require.FileExists(t, filepath.Join(dir, "index"))

	victim := fileOfKey(t, dir, "pending-1")
	require.NoError(t, os.Remove(victim))
	require.NoError(t, syscall.Mkfifo(victim, 0o600))

	// Control: a scan (no index) opens at once and reports the FIFO.
	scanDir := filepath.Join(t.TempDir(), "copy")
	require.NoError(t, os.Mkdir(scanDir, 0o700))
	for _, n := range dirNames(t, dir) {
		src := filepath.Join(dir, n)
		fi, err := os.Lstat(src)
		require.NoError(t, err)
		switch {
		case n == "index" || n == "LOCK" || fi.IsDir():
		case fi.Mode()&os.ModeNamedPipe != 0:
			require.NoError(t, syscall.Mkfifo(filepath.Join(scanDir, n), 0o600))
		default:
			data, err := os.ReadFile(src)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(scanDir, n), data, 0o600))
		}
	}
	cs, err, ok := rtOpenWithin(t, scanDir, 3*time.Second, rtFeedFIFO(filepath.Join(scanDir, filepath.Base(victim))))
	require.True(t, ok, "control: a scan opens the same directory at once")
	require.NoError(t, err)
	_, lerr := cs.List(ctx, persist.Filter{})
	require.Len(t, persist.CorruptErrors(lerr), 1, "control: the scan reports the FIFO as damage")
	require.NoError(t, cs.Close())

	s, err, ok = rtOpenWithin(t, dir, 3*time.Second, rtFeedFIFO(victim))
	if !ok {
		t.Fatalf("OpenDir from the index did not return in 3s: it rereads %s, now a FIFO, with the regular-file mode the index recorded, and blocks in os.ReadFile", filepath.Base(victim))
	}
	require.NoError(t, err)
	defer s.Close()
	_, lerr = s.List(ctx, persist.Filter{})
	require.Len(t, persist.CorruptErrors(lerr), 1, "the FIFO is reported as damage")
}

// TestIndexNeverHidesAnUnresolvedIntent_FileRestoredInPlace: the index is
// a cache that "exists only while it describes" the record files; an
// intent whose outcome is unknown must never drop out of the unresolved
// list (Client.Unresolved, SettleAll, the clock mark seeding).
//
// Path to the failure: intent r is saved unresolved, its file is backed up,
// then r resolves and the store closes, writing an index that holds only
// the unresolved files and the directory's entry count. An engineer or a
// backup tool puts r's file back in place as it was (state unknown, e.g.
// the server's answer was not trusted). The entry count is unchanged, so
// merge marks every file the index does not hold as resolved without
// reading it, and the restored intent never shows in List{Unresolved}; the
// index written at Close keeps it out for every later OpenDir. A scan
// of the same directory lists it.
func TestIndexNeverHidesAnUnresolvedIntent_FileRestoredInPlace(t *testing.T) {
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	u := persisttest.NewRecord("u-1", t0)
	require.NoError(t, persisttest.Put(ctx, s, u))
	r := persisttest.NewRecord("r-1", t0.Add(time.Second))
	require.NoError(t, persisttest.Put(ctx, s, r))
	path := fileOfKey(t, dir, "r-1")
	backup, err := os.ReadFile(path)
	require.NoError(t, err)
	done := r.Clone()
	done.State, done.Response = persist.StateSucceeded, &persist.Response{StatusCode: 201}
	require.NoError(t, persisttest.Put(ctx, s, done))
	require.NoError(t, s.Close())
	require.FileExists(t, filepath.Join(dir, "index"))

	// Restored as it was: a new file (new inode, new ctime), same name.
	require.NoError(t, os.WriteFile(path+".restore", backup, 0o600))
	require.NoError(t, os.Rename(path+".restore", path))

	unresolvedKeys := func(s *persist.FileStore) []string {
		// A Get of a key the index does not hold waits for the listing.
		_, err := s.Get(ctx, "absent")
		require.True(t, errors.Is(err, persist.ErrNotFound))
		got, err := s.List(ctx, persist.Filter{Unresolved: true})
		require.NoError(t, err)
		return keysOf(got)
	}

	// Control: without the index, a scan lists both intents.
	scanDir := filepath.Join(t.TempDir(), "copy")
	require.NoError(t, os.Mkdir(scanDir, 0o700))
	for _, n := range dirNames(t, dir) {
		if n == "index" || n == "LOCK" || filepath.Ext(n) != ".json" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(scanDir, n), data, 0o600))
	}
	cs, err := persist.OpenDir(scanDir, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"u-1", "r-1"}, unresolvedKeys(cs), "control: a scan lists the restored intent")
	require.NoError(t, cs.Close())

	s, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	got := unresolvedKeys(s)
	require.NoError(t, s.Close())
	s, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	again := unresolvedKeys(s)
	require.NoError(t, s.Close())
	require.ElementsMatch(t, []string{"u-1", "r-1"}, got,
		"the intent restored in place, whose outcome is unknown, is missing from the unresolved list: the index counted the same entries, so its file was taken as resolved unread")
	require.ElementsMatch(t, []string{"u-1", "r-1"}, again, "and stays missing after the next OpenDir")
}

// TestBadInputLosesNothing_NotUTF8: bad input gets a clear error and
// loses nothing; a record reads back as written (persist.Store's
// contract).
//
// Path to the failure: Record.Validate checks neither Name nor header
// values for UTF-8, so Write accepts a Name "checkout:caf\xe9" (Latin-1
// input) and a header value "caf\xe9" (obs-text, which HTTP allows and
// net/http sends), and returns nil. encodeRecord's json.Marshal replaces
// the invalid byte with U+FFFD, so the file holds another Name and other
// header bytes than the record written: a resolved record, read from its
// file, is at once a *CorruptError ("the name inside does not belong to
// this file name"), and an unresolved one is so after any OpenDir that
// scans (a kill after its arming write removed the index). The index,
// in gob, keeps the bytes, so the store answers differently by whether
// the index survived.
func TestBadInputLosesNothing_NotUTF8(t *testing.T) {
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)

	paid := persisttest.NewRecord("paid-1", t0)
	paid.Name = "checkout:caf\xe9"
	paid.State, paid.Response = persist.StateSucceeded, &persist.Response{StatusCode: 201}
	werr := persisttest.Put(ctx, s, paid)
	pending := persisttest.NewRecord("pending-1", t0)
	pending.Header["X-Note"] = []string{"caf\xe9"}
	require.NoError(t, persisttest.Put(ctx, s, pending))
	_, gerr := s.Get(ctx, "paid-1")
	require.NoError(t, s.Close())
	if werr == nil && gerr != nil {
		t.Errorf("Write of a record whose Name is not UTF-8 returned nil, and the record is unreadable at once: %v", gerr)
	}

	// As after a kill: the index is gone, OpenDir scans.
	require.NoError(t, os.Remove(filepath.Join(dir, "index")))
	s, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	defer s.Close()
	got, err := s.Get(ctx, "pending-1")
	require.NoError(t, err)
	if g := got.Header["X-Note"]; len(g) != 1 || g[0] != "caf\xe9" {
		t.Errorf("the intent's header value reads back as %q, not the %q it was written (and sent) with: every resend after the restart sends other bytes", g, "caf\xe9")
	}
}
