package persist

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/persist/internal/fsys"
)

// Exported for the tests in package persist_test.

// FileName is the name of the file of the record for key and name.
func FileName(key, name string) string { return fileName(key, name) }

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
		flushing, left := s.flushing, s.deferred
		s.mu.Unlock()
		if !flushing {
			return left == 0
		}
		time.Sleep(100 * time.Microsecond)
	}
}

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

// IndexEntry is an entry of the index, for EditIndex: its id, its file's
// name and its record.
type IndexEntry struct {
	ID   string
	File string
	Rec  *Record
}

// EditIndex decodes the index of the store in dir, passes its entries to
// edit, and writes the index back in place, its stamps as they were: an
// index damaged, stale or copied in such that its checksum and stamps
// still hold. edit may change ids and records.
func EditIndex(dir string, edit func(ents []*IndexEntry)) error {
	path := filepath.Join(dir, indexFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	known, ents, d, err := decodeIndexHead(data)
	if err != nil {
		return err
	}
	if err := d.records(ents); err != nil {
		return err
	}
	var view []*IndexEntry
	for _, ie := range ents {
		view = append(view, &IndexEntry{ID: ie.id, File: ie.e.name, Rec: ie.e.rec})
	}
	edit(view)
	for i, v := range view {
		ents[i].id, ents[i].e.rec = v.ID, v.Rec
	}
	return os.WriteFile(path, encodeIndex(known, ents), 0o600)
}

// Stem is the id of key's entry in the store and the index.
var Stem = stem

// ErrInsecureDir is matched by the error of OpenDir for a directory that
// other users may read or enter.
var ErrInsecureDir = errInsecureDir
