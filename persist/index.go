package persist

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"

	"github.com/idemkit/idem/persist/internal/fsys"
)

// The index is a cache of what OpenDir needs at start. It holds the
// unresolved records, their files and those files' stamps. It exists only
// while it describes the directory. The store writes it when at rest, and
// removes it before any change of a record (see change). The package docs
// ("The index") say why it can be trusted, and when it is not.
const (
	indexFile = "index"
	// indexMagic starts every index file. The byte after it is
	// indexVersion. An index of another version is rebuilt, never read.
	indexMagic   = "idem-persist-index\n"
	indexVersion = 6
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errIndex is why an index is not used or not written. It never reaches
// a caller.
var errIndex = errors.New("index not usable")

// indexHead is the first gob value of the index. The records follow as a
// second one. So the files are stamped while the records are decoded.
type indexHead struct {
	Known int // how many entries the directory held
	Files []indexed
}

// indexed is a file of the index, one that may hold an unresolved
// record.
type indexed struct {
	Name  string
	Mode  fs.FileMode
	Stamp fsys.Stamp
	Twin  bool // a file of a key that has two (see entry)
	// HasRec is set if the index holds the file's record. That record was
	// read or written with this stamp.
	HasRec bool
}

// indexPath returns the path of the index file.
func (s *FileStore) indexPath() string { return filepath.Join(s.dir, indexFile) }

// loadIndex fills s.entries from the index, if there is one. It stamps
// every indexed file again. A file rewritten in place since is read
// again. A missing file makes the whole index unusable. loadIndex returns
// nil if it used the index. Otherwise s.entries is untouched.
func (s *FileStore) loadIndex() error {
	path := s.indexPath()
	idxSt, err := s.fs.Stamp(path)
	if err != nil {
		return err
	}
	data, err := s.fs.ReadFile(path)
	if err != nil {
		return err
	}
	d, head, err := decodeIndexHead(data)
	if err != nil {
		return err
	}
	names := make([]string, len(head.Files))
	for i, f := range head.Files {
		names[i] = f.Name
	}
	// The files are stamped while the records are decoded. The system
	// calls are most of the cost.
	type stamped struct {
		st  []fsys.Stamp
		err error
	}
	ch := make(chan stamped, 1)
	go func() {
		st, err := s.fs.Stamps(s.dir, names)
		ch <- stamped{st, err}
	}()
	ents, err := indexEntries(d, head)
	got := <-ch
	if err != nil {
		return err
	}
	if got.err != nil {
		return got.err
	}
	if err := s.useIndex(head.Files, ents, got.st, idxSt); err != nil {
		return err
	}
	s.known, s.indexed = head.Known, true
	return nil
}

// decodeIndexHead checks an index file's version and checksum. It
// decodes the head, and leaves the records in d.
func decodeIndexHead(data []byte) (d *gob.Decoder, head indexHead, err error) {
	rest, ok := bytes.CutPrefix(data, []byte(indexMagic))
	switch {
	case !ok || len(rest) < 5:
		return nil, head, fmt.Errorf("%w: not an index file", errIndex)
	case rest[0] != indexVersion:
		return nil, head, fmt.Errorf("%w: index version %d", errIndex, rest[0])
	case crc32.Checksum(rest[5:], crcTable) != binary.LittleEndian.Uint32(rest[1:5]):
		return nil, head, fmt.Errorf("%w: checksum mismatch", errIndex)
	}
	d = gob.NewDecoder(bytes.NewReader(rest[5:]))
	if err := d.Decode(&head); err != nil {
		return nil, head, fmt.Errorf("%w: %w", errIndex, err)
	}
	return d, head, nil
}

// indexEntries decodes the records that follow head in d. It returns the
// entries of the index's files, each checked. Its name must be a record
// file's. Its record, if any, must be unresolved. It must belong to the
// file, as a record read from the file must. An index may be damaged
// past its checksum, or copied from another store. It must never report
// a record under another key, or in another state, than its file holds.
func indexEntries(d *gob.Decoder, head indexHead) ([]*entry, error) {
	var recs []*Record
	if err := d.Decode(&recs); err != nil {
		return nil, fmt.Errorf("%w: %w", errIndex, err)
	}
	ents := make([]*entry, len(head.Files))
	for i, f := range head.Files {
		p, ok := parseName(f.Name)
		if !ok {
			return nil, fmt.Errorf("%w: %s is not a record file's name", errIndex, f.Name)
		}
		e := &entry{name: f.Name, p: p, mode: f.Mode, twin: f.Twin}
		ents[i] = e
		if !f.HasRec {
			continue
		}
		if len(recs) == 0 {
			return nil, fmt.Errorf("%w: records missing", errIndex)
		}
		e.rec, e.st, recs = recs[0], f.Stamp, recs[1:]
		if err := checkIndexed(e); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errIndex, f.Name, err)
		}
	}
	if len(recs) != 0 {
		return nil, fmt.Errorf("%w: records in excess", errIndex)
	}
	return ents, nil
}

// checkIndexed returns an error unless e's record is one the store could
// have kept from e's file.
func checkIndexed(e *entry) error {
	r := e.rec
	switch {
	case r.Version != FormatVersion:
		return fmt.Errorf("format version %d", r.Version)
	case r.State.Resolved():
		return errors.New("the record is resolved")
	}
	if err := r.Validate(); err != nil {
		return err
	}
	return belongs(e.p, r)
}

// useIndex makes entries those of the index. now holds the stamps their
// files have now, and idxSt the index's own. A file may have been
// rewritten in place since the index was written. Then its stamp is not
// the indexed one, or it changed in the clock tick of the index's write
// or after. Such a file is read again.
func (s *FileStore) useIndex(files []indexed, ents []*entry, now []fsys.Stamp, idxSt fsys.Stamp) error {
	entries := make(map[string]*entry, len(ents))
	var reread []*entry
	for i, e := range ents {
		st := now[i]
		switch {
		case st == (fsys.Stamp{}):
			return fmt.Errorf("%w: %s is missing", errIndex, e.name)
		case st != files[i].Stamp || st.Change >= idxSt.Change:
			e.rec, e.st = nil, fsys.Stamp{} // changed in place since: read the file
		}
		id := e.p.id
		if id == "" || e.twin && entries[id] != nil {
			id = "?" + e.name
		}
		if entries[id] != nil {
			return fmt.Errorf("%w: %s is listed twice", errIndex, id)
		}
		entries[id] = e
		if e.rec == nil {
			reread = append(reread, e)
		}
	}
	s.entries = entries
	for _, e := range reread {
		s.record(e)
	}
	return nil
}

// change readies the directory for a change of a record. It removes the
// index, which describes the directory before the change. It counts the
// change too. A power cut keeps the removal if it keeps the change. The
// store's directory sync after the change covers both. s.mu must be held.
func (s *FileStore) change() error {
	s.changes++
	if !s.indexed {
		return nil
	}
	if err := s.fs.Remove(s.indexPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("persist: cannot remove the index %s before a change (nothing was changed): %w", s.indexPath(), err)
	}
	s.indexed = false
	return nil
}

// writeIndex writes the index for the store as it is. It does so if the
// store knows every entry and has no index in place. It first syncs the
// directory. So every change the index describes is durable before it. It
// gives up if a record changes while it works. The index is then written
// next time.
func (s *FileStore) writeIndex() error {
	c, data, err := s.indexSnapshot()
	if err != nil || data == nil {
		return err
	}
	s.indexSyncs.Add(1)
	if err := s.fs.SyncDir(s.dir); err != nil {
		return err
	}
	// Only the last check and the rename hold s.mu. So no save waits for
	// the index's syncs.
	tmp, err := s.writeTemp(data, &s.indexSyncs)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.changes != c {
		err = errIndex
	} else if err = s.fs.Rename(tmp, s.indexPath()); err == nil {
		s.indexed = true
	}
	s.mu.Unlock()
	if err != nil {
		_ = s.fs.Remove(tmp)
		return err
	}
	// So that the next start after a power cut may use it too.
	s.indexSyncs.Add(1)
	_ = s.fs.SyncDir(s.dir)
	return nil
}

// indexSnapshot returns the content of the index for the store as it
// is, and s.changes when it was taken. The index holds every entry that
// may hold an unresolved record. It holds the record too, with its file's
// stamp. indexSnapshot returns no content if the index in place describes
// the store. It returns errIndex if the store does not know every entry.
func (s *FileStore) indexSnapshot() (c int, data []byte, err error) {
	s.mu.Lock()
	switch {
	case s.indexed:
		s.mu.Unlock()
		return 0, nil, nil
	case !s.scanned || s.entries == nil:
		s.mu.Unlock()
		return 0, nil, errIndex
	}
	c = s.changes
	head := indexHead{Known: len(s.entries), Files: []indexed{}}
	recs := []*Record{}
	for _, e := range s.entries {
		if e.resolved {
			continue
		}
		f := indexed{Name: e.name, Mode: e.mode, Twin: e.twin}
		if e.corrupt == nil && e.st != (fsys.Stamp{}) {
			// Only with the stamp the file had when its record was
			// read or written. A change since then must show.
			f.Stamp, f.HasRec = e.st, true
			recs = append(recs, e.rec)
		}
		head.Files = append(head.Files, f)
	}
	s.mu.Unlock()
	data, err = encodeIndex(head, recs)
	return c, data, err
}

// encodeIndex returns the content of an index file. It holds the magic
// and the version, then a CRC-32C of the rest. Then come head and recs,
// in gob.
func encodeIndex(head indexHead, recs []*Record) ([]byte, error) {
	b := bytes.NewBufferString(indexMagic)
	b.Write([]byte{indexVersion, 0, 0, 0, 0})
	enc := gob.NewEncoder(b)
	if err := enc.Encode(head); err != nil {
		return nil, err
	}
	if err := enc.Encode(recs); err != nil {
		return nil, err
	}
	data := b.Bytes()
	n := len(indexMagic) + 1
	binary.LittleEndian.PutUint32(data[n:n+4], crc32.Checksum(data[n+4:], crcTable))
	return data, nil
}
