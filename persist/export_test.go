package persist

import (
	"errors"
	"time"

	"github.com/idemkit/idem/persist/internal/fsys"
)

// Exported for the tests in package persist_test.

// FileName is the name of the file of an unresolved record for key and
// name.
func FileName(key, name string) string { return fileName(key, name, false) }

// ResolvedFileName is the name of the file of a resolved record for key and
// name.
func ResolvedFileName(key, name string) string { return fileName(key, name, true) }

// Syncs returns how many fsync calls s has made.
func (s *FileStore) Syncs() int64 { return s.syncs.Load() }

// OpenDirFS opens the store in dir, an absolute path, on the file system f.
func OpenDirFS(f fsys.FS, dir string, opts *Options) (*FileStore, error) {
	return openDir(f, dir, opts)
}

// WaitDeferred waits until no directory sync of SaveDeferred runs, and
// reports whether none is left to do.
func (s *FileStore) WaitDeferred() bool {
	for {
		s.mu.Lock()
		flushing, left := s.flushing, len(s.deferred)
		s.mu.Unlock()
		if !flushing {
			return left == 0
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// SaveShared is saveShared, for the tests of the shared save.
var SaveShared = saveShared

// FromIndex reports whether OpenDir opened s from its index rather than
// from a scan of the directory.
func (s *FileStore) FromIndex() bool { return s.fromIndex }

// IndexRoundTrip encodes r as the index does and decodes it back.
func IndexRoundTrip(r *Record) (*Record, error) {
	e := &encoder{}
	e.record(r)
	d := &decoder{b: e.b, s: string(e.b)}
	got := d.record()
	if d.err == nil && len(d.b) != 0 {
		d.err = errors.New("trailing bytes")
	}
	return got, d.err
}
