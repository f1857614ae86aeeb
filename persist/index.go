package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"time"

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
	indexVersion = 7
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errIndex is why an index is not used or not written. It never reaches
// a caller.
var errIndex = errors.New("index not usable")

// indexed is a file of the index, one that may hold an unresolved
// record.
type indexed struct {
	Name  string
	Mode  fs.FileMode
	Stamp fsys.Stamp
	Twin  bool // a file of a key that has two (see entry)
	// Rec is the file's record, if the index holds it. It was read or
	// written with Stamp.
	Rec *Record
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
	d, known, files, err := decodeIndexFiles(data)
	if err != nil {
		return err
	}
	names := make([]string, len(files))
	for i, f := range files {
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
	ents, err := indexEntries(d, files)
	got := <-ch
	if err != nil {
		return err
	}
	if got.err != nil {
		return got.err
	}
	if err := s.useIndex(files, ents, got.st, idxSt); err != nil {
		return err
	}
	s.known, s.indexed = known, true
	return nil
}

// indexEntries decodes the records that follow files in d. It returns
// the entries of the index's files, each checked. Its name must be a
// record file's. Its record, if any, must be unresolved. It must belong
// to the file, as a record read from the file must. An index may be
// damaged past its checksum, or copied from another store. It must never
// report a record under another key, or in another state, than its file
// holds.
func indexEntries(d *decoder, files []indexed) ([]*entry, error) {
	ents := make([]*entry, len(files))
	for i := range files {
		f := &files[i]
		p, ok := parseName(f.Name)
		if !ok {
			return nil, fmt.Errorf("%w: %s is not a record file's name", errIndex, f.Name)
		}
		e := &entry{name: f.Name, p: p, mode: f.Mode, twin: f.Twin}
		ents[i] = e
		if f.Rec == nil {
			continue
		}
		f.Rec = d.record()
		e.rec, e.st = f.Rec, f.Stamp
		if d.err != nil {
			return nil, d.err
		}
		if err := checkIndexed(e); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errIndex, f.Name, err)
		}
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: bytes in excess", errIndex)
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
	known := len(s.entries)
	var files []indexed
	for _, e := range s.entries {
		if e.resolved {
			continue
		}
		f := indexed{Name: e.name, Mode: e.mode, Twin: e.twin}
		if e.corrupt == nil && e.st != (fsys.Stamp{}) {
			// Only with the stamp the file had when its record was
			// read or written. A change since then must show.
			f.Stamp, f.Rec = e.st, e.rec
		}
		files = append(files, f)
	}
	s.mu.Unlock()
	return c, encodeIndex(known, files), nil
}

// The index's encoding is flat: varints, and strings and byte slices
// after their length. The decoding was most of an open's time in gob.
// It has no field names. So TestIndex checks that a record with every
// field set comes back whole.

// encodeIndex returns the content of an index file: the magic, the
// version and a CRC-32C of the rest. Then come known and the files, and
// last the files' records.
func encodeIndex(known int, files []indexed) []byte {
	b := append([]byte(indexMagic), indexVersion, 0, 0, 0, 0)
	b = binary.AppendUvarint(b, uint64(known))
	b = binary.AppendUvarint(b, uint64(len(files)))
	for _, f := range files {
		b = appendString(b, f.Name)
		b = binary.AppendUvarint(b, uint64(f.Mode))
		b = binary.AppendUvarint(b, f.Stamp.Ino)
		b = binary.AppendVarint(b, f.Stamp.Size)
		b = binary.AppendVarint(b, f.Stamp.Mod)
		b = binary.AppendVarint(b, f.Stamp.Change)
		b = appendBool(b, f.Twin)
		b = appendBool(b, f.Rec != nil)
	}
	for _, f := range files {
		if f.Rec != nil {
			b = appendRecord(b, f.Rec)
		}
	}
	n := len(indexMagic) + 1
	binary.LittleEndian.PutUint32(b[n:n+4], crc32.Checksum(b[n+4:], crcTable))
	return b
}

func appendRecord(b []byte, r *Record) []byte {
	b = binary.AppendVarint(b, int64(r.Version))
	b = appendString(b, r.Rev, r.Key, r.Name, r.Method, r.URL)
	b = appendHeader(b, r.Header)
	b = appendBytes(b, r.Body)
	b = appendString(b, r.Fingerprint, r.KeyHeader)
	b = binary.AppendUvarint(b, r.Seq)
	b = appendTime(b, r.CreatedAt, r.UpdatedAt)
	b = appendString(b, string(r.State))
	b = binary.AppendVarint(b, int64(r.Attempts))
	b = appendBool(b, r.Response != nil)
	if p := r.Response; p != nil {
		b = binary.AppendVarint(b, int64(p.StatusCode))
		b = appendHeader(b, p.Header)
		b = appendBytes(b, p.Body)
		b = appendBool(b, p.Replayed, p.Oversized)
	}
	b = appendBool(b, r.Clocks != nil)
	if c := r.Clocks; c != nil {
		b = appendString(b, c.ArmBoot, c.WriteBoot, c.SendBoot)
		b = binary.AppendVarint(b, int64(c.Armed))
		b = binary.AppendVarint(b, int64(c.Written))
		b = binary.AppendVarint(b, int64(c.SendBy))
		b = appendTime(b, c.ArmMark, c.Mark, c.SendWall)
	}
	b = appendBool(b, r.Tombstone, r.Redirected, r.HandedOut)
	return appendString(b, r.Holder)
}

func appendString(b []byte, ss ...string) []byte {
	for _, s := range ss {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

func appendBool(b []byte, vs ...bool) []byte {
	for _, v := range vs {
		if v {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	return b
}

// appendHeader appends h's fields in name order, each with its values.
// So the index's bytes depend on its content alone. A field without
// values comes back nil, as normHeader keeps it.
func appendHeader(b []byte, h http.Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(h[k])))
		b = appendString(b, h[k]...)
	}
	return b
}

// appendTime appends each time as time.Time's binary form, which keeps
// its instant and its zone's offset.
func appendTime(b []byte, ts ...time.Time) []byte {
	for _, t := range ts {
		m, _ := t.MarshalBinary() // fails only for a zone offset out of range
		b = appendString(b, string(m))
	}
	return b
}

// decodeIndexFiles checks an index file's version and checksum. It
// decodes known and the files, and leaves the records in d.
func decodeIndexFiles(data []byte) (d *decoder, known int, files []indexed, err error) {
	rest, ok := bytes.CutPrefix(data, []byte(indexMagic))
	switch {
	case !ok || len(rest) < 5:
		return nil, 0, nil, fmt.Errorf("%w: not an index file", errIndex)
	case rest[0] != indexVersion:
		return nil, 0, nil, fmt.Errorf("%w: index version %d", errIndex, rest[0])
	case crc32.Checksum(rest[5:], crcTable) != binary.LittleEndian.Uint32(rest[1:5]):
		return nil, 0, nil, fmt.Errorf("%w: checksum mismatch", errIndex)
	}
	// One string for the whole index: the records' strings share it.
	d = &decoder{b: string(rest[5:])}
	known = d.int()
	n := d.int()
	d.failIf(n > len(d.b))
	for i := 0; i < n && d.err == nil; i++ {
		f := indexed{Name: d.str(), Mode: fs.FileMode(d.uint())}
		f.Stamp = fsys.Stamp{Ino: d.uint(), Size: d.sint(), Mod: d.sint(), Change: d.sint()}
		f.Twin = d.bool()
		if d.bool() {
			f.Rec = &Record{} // read by indexEntries, after the files
		}
		files = append(files, f)
	}
	return d, known, files, d.err
}

// decoder reads what encodeIndex wrote. Its first failure sticks in err,
// and every read after it gives zero values.
type decoder struct {
	b   string
	err error
}

func (d *decoder) failIf(bad bool) {
	if bad {
		d.fail()
	}
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or malformed", errIndex)
	}
	d.b = ""
}

func (d *decoder) uint() uint64 {
	var v uint64
	for i := 0; i < len(d.b) && i < binary.MaxVarintLen64; i++ {
		c := d.b[i]
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			d.b = d.b[i+1:]
			return v
		}
	}
	d.fail()
	return 0
}

func (d *decoder) sint() int64 {
	u := d.uint()
	return int64(u>>1) ^ -int64(u&1) // as binary.AppendVarint zig-zags it
}

// int reads a length or a count. Its caller checks it against what is
// left, where it counts bytes or items.
func (d *decoder) int() int {
	u := d.uint()
	if u > 1<<31 {
		d.fail()
		return 0
	}
	return int(u)
}

func (d *decoder) str() string {
	n := d.int()
	if n > len(d.b) {
		d.fail()
		return ""
	}
	s := d.b[:n]
	d.b = d.b[n:]
	return s
}

// bytes reads a byte slice, nil if empty, as normalize keeps it.
func (d *decoder) bytes() []byte {
	if s := d.str(); s != "" {
		return []byte(s)
	}
	return nil
}

func (d *decoder) bool() bool {
	if d.b == "" {
		d.fail()
		return false
	}
	v := d.b[0]
	d.b = d.b[1:]
	if v > 1 {
		d.fail()
	}
	return v == 1
}

func (d *decoder) header() http.Header {
	n := d.int()
	if n == 0 || n > len(d.b) {
		d.failIf(n != 0)
		return nil
	}
	h := make(http.Header, n)
	for range n {
		k := d.str()
		var vs []string
		if m := d.int(); m > 0 && m <= len(d.b) {
			vs = make([]string, m)
			for i := range vs {
				vs[i] = d.str()
			}
		} else {
			d.failIf(m != 0)
		}
		h[k] = vs
	}
	return h
}

func (d *decoder) time() time.Time {
	var t time.Time
	if err := t.UnmarshalBinary([]byte(d.str())); err != nil {
		d.fail()
	}
	return t
}

// record reads what appendRecord wrote.
func (d *decoder) record() *Record {
	r := &Record{Version: int(d.sint()), Rev: d.str(), Key: d.str(), Name: d.str(), Method: d.str(), URL: d.str()}
	r.Header = d.header()
	r.Body, r.Fingerprint, r.KeyHeader = d.bytes(), d.str(), d.str()
	r.Seq = d.uint()
	r.CreatedAt, r.UpdatedAt = d.time(), d.time()
	r.State, r.Attempts = State(d.str()), int(d.sint())
	if d.bool() {
		r.Response = &Response{StatusCode: int(d.sint()), Header: d.header(), Body: d.bytes()}
		r.Response.Replayed, r.Response.Oversized = d.bool(), d.bool()
	}
	if d.bool() {
		c := &Clocks{ArmBoot: d.str(), WriteBoot: d.str(), SendBoot: d.str()}
		c.Armed, c.Written, c.SendBy = time.Duration(d.sint()), time.Duration(d.sint()), time.Duration(d.sint())
		c.ArmMark, c.Mark, c.SendWall = d.time(), d.time(), d.time()
		r.Clocks = c
	}
	r.Tombstone, r.Redirected, r.HandedOut = d.bool(), d.bool(), d.bool()
	r.Holder = d.str()
	return r
}
