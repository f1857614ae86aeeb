package persist

import (
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

// Kept returns the copy of r a store keeps.
func Kept(r *Record) *Record { return prepare(r, Options{}) }

// IndexRoundTrip encodes r as the index does and decodes it back.
func IndexRoundTrip(r *Record) (*Record, error) {
	data, err := encodeIndex(indexHead{Files: []indexed{{HasRec: true}}}, []*Record{r})
	if err != nil {
		return nil, err
	}
	d, _, err := decodeIndexHead(data)
	if err != nil {
		return nil, err
	}
	var recs []*Record
	if err := d.Decode(&recs); err != nil {
		return nil, err
	}
	return recs[0], nil
}

// IndexEntry is a file of the index, for EditIndex: its name and its
// record, nil if the index holds none.
type IndexEntry struct {
	File string
	Rec  *Record
}

// EditIndex decodes the index of the store in dir, passes its entries to
// edit, and writes the index back in place, its stamps as they were: an
// index damaged, stale or copied in such that its checksum and stamps
// still hold. edit may change files and records, and the files' order.
func EditIndex(dir string, edit func(ents []*IndexEntry)) error {
	path := filepath.Join(dir, indexFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	d, head, err := decodeIndexHead(data)
	if err != nil {
		return err
	}
	var recs []*Record
	if err := d.Decode(&recs); err != nil {
		return err
	}
	var view []*IndexEntry
	files := map[string]indexed{}
	for _, f := range head.Files {
		ie := &IndexEntry{File: f.Name}
		if f.HasRec {
			ie.Rec, recs = recs[0], recs[1:]
		}
		files[f.Name] = f
		view = append(view, ie)
	}
	edit(view)
	head.Files, recs = nil, nil
	for _, v := range view {
		f := files[v.File]
		f.Name, f.HasRec = v.File, v.Rec != nil
		head.Files = append(head.Files, f)
		if v.Rec != nil {
			recs = append(recs, v.Rec)
		}
	}
	if data, err = encodeIndex(head, recs); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// Stem is the id of key's entry in the store and the index.
var Stem = stem

// ErrInsecureDir is matched by the error of OpenDir for a directory that
// other users may read or enter.
var ErrInsecureDir = errInsecureDir
