package persist

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
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
	d, _, _, err := decodeIndexFiles(encodeIndex(nameSet{}, []entry{{rec: r}}))
	if err != nil {
		return nil, err
	}
	got := &Record{}
	if d.record(got); d.err == nil && d.s != "" {
		return nil, errors.New("bytes in excess")
	}
	return got, d.err
}

// IndexOfBody returns an index file of this version whose content after
// its checksum is body, the checksum made to hold.
func IndexOfBody(body []byte) []byte {
	data := append([]byte(indexMagic), indexVersion, 0, 0, 0, 0)
	data = append(data, body...)
	n := len(indexMagic) + 1
	binary.LittleEndian.PutUint32(data[n:n+4], crc32.Checksum(data[n+4:], crcTable))
	return data
}

// DecodeIndexBody decodes an index whose content after its checksum is
// body, the checksum made to hold.
func DecodeIndexBody(body []byte) error {
	c, _, files, err := decodeIndexFiles(IndexOfBody(body))
	if err == nil {
		err = indexEntries(c, files)
	}
	return err
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
	d, known, files, err := decodeIndexFiles(data)
	if err != nil {
		return err
	}
	var view []*IndexEntry
	byName := map[string]entry{}
	for _, f := range files {
		if f.rec != nil {
			d.record(f.rec)
		}
		byName[f.name] = f
		view = append(view, &IndexEntry{File: f.name, Rec: f.rec})
	}
	if d.err != nil {
		return d.err
	}
	edit(view)
	files = nil
	for _, v := range view {
		f := byName[v.File]
		f.name, f.rec = v.File, v.Rec
		files = append(files, f)
	}
	return os.WriteFile(path, encodeIndex(known, files), 0o600)
}

// Stem is the id of key's entry in the store and the index.
var Stem = stem

// ErrInsecureDir is matched by the error of OpenDir for a directory that
// other users may read or enter.
var ErrInsecureDir = errInsecureDir
