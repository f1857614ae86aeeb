//go:build unix

package persist_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
	"github.com/stretchr/testify/require"
)

// A FIFO or a link in a record's or the index's place must not block or
// feed OpenDir without end.

func init() {
	openDirUnix = append(openDirUnix,
		openDirCase{"an index that is not a regular file is rebuilt at once", fileIndexNotRegular},
		openDirCase{"an indexed file replaced by a FIFO is damage, found at once", fileIndexedFileReplaced},
	)
}

// openWithin runs OpenDir(dir) and waits up to d for it. It returns the
// store and error, or ok false if OpenDir was still running; then unblock
// is called until OpenDir returns, so that nothing leaks.
func openWithin(t *testing.T, dir string, d time.Duration, unblock func()) (s *persist.FileStore, err error, ok bool) {
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

// feedFIFO opens the FIFO at path for writing without blocking, if a
// reader waits on it, and closes it at once: the reader gets EOF.
func feedFIFO(path string) func() {
	return func() {
		fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			_ = syscall.Close(fd)
		}
	}
}

// fileIndexNotRegular: a write or
// open must not spend unbounded time or memory on a damaged or hostile
// directory.
//
// The path that failed: loadIndex Lstat-stamps "index" and then calls
// os.ReadFile on it with no check of its type (record files are checked
// with IsRegular, the index is not). An "index" that is a FIFO blocks
// OpenDir forever in open(2); one that is a symlink to /dev/zero (ReadFile
// follows it, though the stamp was taken with Lstat) makes OpenDir read
// and allocate without end. The app cannot start, and every intent in the
// store is out of reach.
func fileIndexNotRegular(t *testing.T) {
	t.Parallel()
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

	s, err, ok := openWithin(t, dir, 3*time.Second, feedFIFO(idx))
	if !ok {
		t.Fatalf("OpenDir of a directory whose index is a FIFO did not return in 3s: it blocks in os.ReadFile of the index forever")
	}
	require.NoError(t, err)
	got, err := s.List(ctx, persist.Filter{Unresolved: true})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.NoError(t, s.Close())

	// A link to a device that reads without end is not followed.
	require.NoError(t, os.Remove(idx))
	require.NoError(t, os.Symlink("/dev/zero", idx))
	s, err, ok = openWithin(t, dir, 3*time.Second, func() {})
	require.True(t, ok, "OpenDir of a directory whose index links to /dev/zero did not return in 3s")
	require.NoError(t, err)
	defer s.Close()
	got, err = s.List(ctx, persist.Filter{Unresolved: true})
	require.NoError(t, err)
	require.Len(t, got, 1)
}

// fileIndexedFileReplaced: a write or
// open must not spend unbounded time or memory on a damaged or hostile
// directory; a file that is not a regular file is reported as damage
// ("not a regular file"), as a scan reports it.
//
// The path that failed: an unresolved record is in the index with the
// type bits its file had (regular). The file is then replaced by a FIFO
// (or a symlink to one, or to /dev/zero). At OpenDir, useIndex sees the
// stamp changed and rereads the file through record(), which trusts the
// stale mode from the index instead of the file's type now, so it calls
// os.ReadFile on the FIFO and OpenDir blocks forever. Without the index
// (a scan), the same directory opens at once and the file is reported as
// a *CorruptError.
func fileIndexedFileReplaced(t *testing.T) {
	t.Parallel()
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
	cs, err, ok := openWithin(t, scanDir, 3*time.Second, feedFIFO(filepath.Join(scanDir, filepath.Base(victim))))
	require.True(t, ok, "control: a scan opens the same directory at once")
	require.NoError(t, err)
	_, lerr := cs.List(ctx, persist.Filter{})
	require.Len(t, persist.CorruptErrors(lerr), 1, "control: the scan reports the FIFO as damage")
	require.NoError(t, cs.Close())

	s, err, ok = openWithin(t, dir, 3*time.Second, feedFIFO(victim))
	if !ok {
		t.Fatalf("OpenDir from the index did not return in 3s: it rereads %s, now a FIFO, with the regular-file mode the index recorded, and blocks in os.ReadFile", filepath.Base(victim))
	}
	require.NoError(t, err)
	defer s.Close()
	_, lerr = s.List(ctx, persist.Filter{})
	require.Len(t, persist.CorruptErrors(lerr), 1, "the FIFO is reported as damage")
	require.ErrorContains(t, lerr, "not a regular file", "as the scan says")
}
