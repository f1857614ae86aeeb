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

// The index is a cache of what OpenDir needs at start: the unresolved
// records, their files and those files' stamps. It exists only while it
// describes the directory: it is written when the store is at rest, and
// removed before any change of a record (see change). See the package
// docs ("The index") for why it can be trusted, and when it is not.
const (
	indexFile = "index"
	// indexMagic starts every index file; the byte after it is
	// indexVersion. An index of another version is rebuilt, never read.
	indexMagic   = "idem-persist-index\n"
	indexVersion = 5
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errIndex is why an index is not used or not written; it never reaches
// a caller.
var errIndex = errors.New("index not usable")

// indexEntry is one entry of the index.
type indexEntry struct {
	id    string
	e     entry      // its file, and its record: nil if unreadable
	stamp fsys.Stamp // the file's stamp when the index was written
}

// indexPath returns the path of the index file.
func (s *FileStore) indexPath() string { return filepath.Join(s.dir, indexFile) }

// loadIndex fills s.entries from the index, if there is one. Every
// indexed file is stamped again: a file that changed since (rewritten in
// place) is read again, a file that is missing makes the whole index
// unusable. It returns nil if it used the index; otherwise s.entries is
// untouched.
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
	known, ents, d, err := decodeIndexHead(data)
	if err != nil {
		return err
	}
	names := make([]string, len(ents))
	for i, ie := range ents {
		names[i] = ie.e.name
	}
	// The files are stamped while the records are decoded: the system
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
	err = d.records(ents)
	if err == nil {
		err = checkIndexed(ents)
	}
	got := <-ch
	if err != nil {
		return err
	}
	if got.err != nil {
		return got.err
	}
	if err := s.useIndex(ents, got.st, idxSt); err != nil {
		return err
	}
	s.known, s.indexed = known, true
	return nil
}

// useIndex makes entries those of the index, given the stamps their files
// have now and the index's own. A file whose stamp is not the indexed one,
// or which changed in the clock tick of the index's write or after it,
// may have been rewritten in place since: it is read again.
func (s *FileStore) useIndex(ents []indexEntry, now []fsys.Stamp, idxSt fsys.Stamp) error {
	entries := make(map[string]*entry, len(ents))
	var reread []*entry
	for i := range ents {
		ie := &ents[i]
		e := &ie.e
		st := now[i]
		switch {
		case st == (fsys.Stamp{}):
			return fmt.Errorf("%w: %s is missing", errIndex, e.name)
		case st != ie.stamp || st.Change >= idxSt.Change:
			e.rec = nil // changed in place since: read the file
		default:
			e.st = st
		}
		if entries[ie.id] != nil {
			return fmt.Errorf("%w: %s is listed twice", errIndex, ie.id)
		}
		entries[ie.id] = e
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

// checkIndexed returns an error unless every entry of an index is one
// the store could have written: its file's name parses as the index says
// and belongs to the entry, and its record is unresolved and belongs to
// that file (as decodeFile checks a record read from its file). An index
// damaged in a way its checksum does not catch, or copied from another
// store, must never report a record under another key, or in another
// state, than its file holds.
func checkIndexed(ents []indexEntry) error {
	for _, ie := range ents {
		e := &ie.e
		p, ok := parseName(e.name)
		id := p.id
		if id == "" {
			id = "?" + e.name
		}
		if !ok || p != e.p || id != ie.id {
			return fmt.Errorf("%w: %s is not the file of the entry %s", errIndex, e.name, ie.id)
		}
		if e.rec == nil {
			continue
		}
		if e.rec.State.Resolved() {
			return fmt.Errorf("%w: %s: the record is resolved", errIndex, e.name)
		}
		if err := belongs(e.p, e.rec); err != nil {
			return fmt.Errorf("%w: %s: %w", errIndex, e.name, err)
		}
	}
	return nil
}

// change readies the directory for a change of a record: it removes the
// index, which describes the directory before it, and counts the change.
// A power cut keeps the removal if it keeps the change: the store's
// directory sync after the change covers both. s.mu must be held.
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

// writeIndex writes the index for the store as it is, if the store knows
// every entry and has none in place. It first syncs the directory, so
// that every change the index describes is durable before it, and it
// gives up if a record changes while it works: the index is then written
// next time.
func (s *FileStore) writeIndex() error {
	c, known, ents, err := s.indexSnapshot()
	if err != nil || ents == nil {
		return err
	}
	s.indexSyncs.Add(1)
	if err := s.fs.SyncDir(s.dir); err != nil {
		return err
	}
	// Nothing below holds s.mu but the last check and the rename, so
	// that no save waits for the index's encoding or its syncs.
	tmp, err := s.writeTemp(encodeIndex(known, ents), &s.indexSyncs)
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

// indexSnapshot returns the entries the index holds, every one that may
// hold an unresolved record, each with its file's stamp; how many entries
// the store knows; and s.changes when they were taken. It returns no
// entries if the index in place describes the store, and errIndex if the
// store does not know every entry.
func (s *FileStore) indexSnapshot() (c, known int, ents []indexEntry, err error) {
	s.mu.Lock()
	switch {
	case s.indexed:
		s.mu.Unlock()
		return 0, 0, nil, nil
	case !s.scanned || s.entries == nil:
		s.mu.Unlock()
		return 0, 0, nil, errIndex
	}
	c, known = s.changes, len(s.entries)
	ents = []indexEntry{}
	var names []string
	for id, e := range s.entries {
		if e.resolved {
			continue
		}
		ie := indexEntry{id: id, e: entry{name: e.name, p: e.p, mode: e.mode, st: e.st}}
		if e.corrupt == nil && e.st != (fsys.Stamp{}) {
			// Only with the stamp the file had when its record was
			// read or written: a change since then must show.
			ie.e.rec = e.rec
		}
		names = append(names, e.name)
		ents = append(ents, ie)
	}
	s.mu.Unlock()
	stamps, err := s.fs.Stamps(s.dir, names)
	if err != nil {
		return 0, 0, nil, err
	}
	for i := range ents {
		ents[i].stamp = stamps[i]
		if st := ents[i].e.st; st != (fsys.Stamp{}) {
			ents[i].stamp = st
		}
	}
	return c, known, ents, nil
}

// encodeIndex returns the content of an index file of a directory of
// known entries that holds ents: the magic and version, a CRC-32C of the
// rest, known, the entries' files, then their records.
func encodeIndex(known int, ents []indexEntry) []byte {
	e := &encoder{b: make([]byte, 0, 64+len(ents)*600)}
	e.b = append(e.b, indexMagic...)
	e.b = append(e.b, indexVersion, 0, 0, 0, 0)
	body := len(e.b)
	e.uv(uint64(known))
	e.uv(uint64(len(ents)))
	for _, ie := range ents {
		// What parseName says of the name too, which would cost more
		// to parse again than to read.
		e.str(ie.id)
		e.str(ie.e.name)
		e.str(ie.e.p.id)
		e.str(ie.e.p.key)
		e.str(ie.e.p.tag)
		e.uv(uint64(ie.e.mode))
		e.stamp(ie.stamp)
		e.bool(ie.e.rec != nil)
	}
	for _, ie := range ents {
		if ie.e.rec != nil {
			e.record(ie.e.rec)
		}
	}
	binary.LittleEndian.PutUint32(e.b[body-4:body], crc32.Checksum(e.b[body:], crcTable))
	return e.b
}

// decodeIndexHead parses an index file up to the records, which d then
// decodes into ents.
func decodeIndexHead(data []byte) (known int, ents []indexEntry, d *decoder, err error) {
	rest, ok := bytes.CutPrefix(data, []byte(indexMagic))
	if !ok || len(rest) < 5 {
		return 0, nil, nil, fmt.Errorf("%w: not an index file", errIndex)
	}
	if rest[0] != indexVersion {
		return 0, nil, nil, fmt.Errorf("%w: index version %d", errIndex, rest[0])
	}
	if crc32.Checksum(rest[5:], crcTable) != binary.LittleEndian.Uint32(rest[1:5]) {
		return 0, nil, nil, fmt.Errorf("%w: checksum mismatch", errIndex)
	}
	d = &decoder{b: rest[5:], s: string(rest[5:]), headers: map[string]http.Header{}}
	known = int(d.uv())
	n := d.count()
	ents = make([]indexEntry, 0, n)
	for range n {
		ie := indexEntry{id: d.str()}
		ie.e.name = d.str()
		ie.e.p = parsedName{id: d.str(), key: d.str(), tag: d.str()}
		ie.e.mode = fs.FileMode(d.uv())
		ie.stamp = d.stamp()
		if d.bool() {
			ie.e.rec = &Record{} // decoded by records
		}
		if d.err != nil {
			break
		}
		ents = append(ents, ie)
	}
	if d.err != nil {
		return 0, nil, nil, fmt.Errorf("%w: %w", errIndex, d.err)
	}
	return known, ents, d, nil
}

// records decodes the records of ents, which decodeIndexHead left.
func (d *decoder) records(ents []indexEntry) error {
	for i := range ents {
		if ents[i].e.rec != nil {
			ents[i].e.rec = d.record()
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = errors.New("trailing bytes")
	}
	if d.err != nil {
		return fmt.Errorf("%w: %w", errIndex, d.err)
	}
	return nil
}

// encoder appends the index's binary encoding to b.
type encoder struct{ b []byte }

func (e *encoder) uv(x uint64) { e.b = binary.AppendUvarint(e.b, x) }
func (e *encoder) v(x int64)   { e.b = binary.AppendVarint(e.b, x) }

func (e *encoder) str(s string) {
	e.uv(uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) bool(x bool) {
	if x {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

// bytes encodes b, telling nil from empty.
func (e *encoder) bytes(b []byte) {
	if b == nil {
		e.uv(0)
		return
	}
	e.uv(uint64(len(b)) + 1)
	e.b = append(e.b, b...)
}

// header encodes h with its keys in order, so that equal headers encode
// alike: the decoder shares their maps.
func (e *encoder) header(h http.Header) {
	if h == nil {
		e.uv(0)
		return
	}
	e.uv(uint64(len(h)) + 1)
	for _, k := range slices.Sorted(maps.Keys(h)) {
		vs := h[k]
		e.str(k)
		if vs == nil {
			e.uv(0)
			continue
		}
		e.uv(uint64(len(vs)) + 1)
		for _, v := range vs {
			e.str(v)
		}
	}
}

func (e *encoder) time(t time.Time) {
	if t.IsZero() {
		e.b = append(e.b, 0)
		return
	}
	e.b = append(e.b, 1)
	e.v(t.Unix())
	e.uv(uint64(t.Nanosecond()))
}

func (e *encoder) stamp(st fsys.Stamp) {
	e.uv(st.Ino)
	e.v(st.Size)
	e.v(st.Mod)
	e.v(st.Change)
}

// record encodes every field of r; TestIndexRecordFields fails when a
// field of Record is left out.
func (e *encoder) record(r *Record) {
	e.v(int64(r.Version))
	e.str(r.Key)
	e.str(r.Rev)
	e.str(r.Name)
	e.str(r.Method)
	e.str(r.URL)
	e.header(r.Header)
	e.bytes(r.Body)
	e.str(r.Fingerprint)
	e.str(r.KeyHeader)
	e.uv(r.Seq)
	e.time(r.CreatedAt)
	e.time(r.UpdatedAt)
	e.str(string(r.State))
	e.v(int64(r.Attempts))
	if resp := r.Response; resp == nil {
		e.bool(false)
	} else {
		e.bool(true)
		e.v(int64(resp.StatusCode))
		e.header(resp.Header)
		e.bytes(resp.Body)
		e.bool(resp.Replayed)
		e.bool(resp.Oversized)
	}
	if c := r.Clocks; c == nil {
		e.bool(false)
	} else {
		e.bool(true)
		e.str(c.ArmBoot)
		e.v(int64(c.Armed))
		e.str(c.WriteBoot)
		e.v(int64(c.Written))
		e.time(c.ArmMark)
		e.time(c.Mark)
		e.time(c.SendWall)
		e.str(c.SendBoot)
		e.v(int64(c.SendBy))
	}
	e.bool(r.Tombstone)
	e.str(r.Holder)
	e.bool(r.Redirected)
	e.bool(r.HandedOut)
}

// decoder reads what encoder wrote; the first error sticks, and every
// read after it returns zero values. The strings it returns are parts of
// s, a copy of b made once, and the byte slices parts of b: records are
// never changed in place, and callers get copies.
type decoder struct {
	b   []byte
	s   string
	err error
	// headers are the headers decoded so far by their encoding: records
	// with equal headers share one map, as no record the store holds is
	// ever changed in place (callers get copies).
	headers map[string]http.Header
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("truncated or invalid %s", what)
	}
	d.b = nil
}

func (d *decoder) uv() uint64 {
	x, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("number")
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *decoder) v() int64 {
	x, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("number")
		return 0
	}
	d.b = d.b[n:]
	return x
}

// count reads a length, which cannot exceed the bytes left.
func (d *decoder) count() int {
	n := d.uv()
	if n > uint64(len(d.b)) {
		d.fail("length")
		return 0
	}
	return int(n)
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("flag")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bool() bool { return d.byte() == 1 }

func (d *decoder) raw(n int) []byte {
	if n > len(d.b) {
		d.fail("bytes")
		return nil
	}
	b := d.b[:n:n]
	d.b = d.b[n:]
	return b
}

func (d *decoder) str() string {
	n := d.count()
	at := len(d.s) - len(d.b)
	if d.raw(n) == nil {
		return ""
	}
	return d.s[at : at+n]
}

func (d *decoder) bytes() []byte {
	n := d.uv()
	if n == 0 || n-1 > uint64(len(d.b)) {
		if n != 0 {
			d.fail("bytes")
		}
		return nil
	}
	return d.raw(int(n - 1))
}

func (d *decoder) header() http.Header {
	start := len(d.s) - len(d.b)
	if len(d.b) > 0 && d.b[0] == 0 {
		d.b = d.b[1:]
		return nil
	}
	h := d.decodeHeader()
	if d.err != nil || d.headers == nil {
		return h
	}
	enc := d.s[start : len(d.s)-len(d.b)]
	if shared, ok := d.headers[enc]; ok {
		return shared
	}
	d.headers[enc] = h
	return h
}

func (d *decoder) decodeHeader() http.Header {
	n := d.uv()
	if n == 0 || n-1 > uint64(len(d.b)) {
		if n != 0 {
			d.fail("header")
		}
		return nil
	}
	h := make(http.Header, n-1)
	for range n - 1 {
		k := d.str()
		m := d.uv()
		if m == 0 || m-1 > uint64(len(d.b)) {
			if m != 0 {
				d.fail("header")
				return nil
			}
			h[k] = nil
			continue
		}
		vs := make([]string, m-1)
		for i := range vs {
			vs[i] = d.str()
		}
		h[k] = vs
	}
	return h
}

func (d *decoder) time() time.Time {
	if d.byte() == 0 {
		return time.Time{}
	}
	sec := d.v()
	nsec := d.uv()
	if nsec >= 1e9 {
		d.fail("time")
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

func (d *decoder) stamp() fsys.Stamp {
	return fsys.Stamp{Ino: d.uv(), Size: d.v(), Mod: d.v(), Change: d.v()}
}

// record decodes a record and checks it as decodeRecord does.
func (d *decoder) record() *Record {
	r := &Record{
		Version: int(d.v()), Key: d.str(), Rev: d.str(), Name: d.str(), Method: d.str(), URL: d.str(),
		Header: d.header(), Body: d.bytes(), Fingerprint: d.str(), KeyHeader: d.str(), Seq: d.uv(),
		CreatedAt: d.time(), UpdatedAt: d.time(), State: State(d.str()), Attempts: int(d.v()),
	}
	if d.bool() {
		r.Response = &Response{StatusCode: int(d.v()), Header: d.header(), Body: d.bytes(), Replayed: d.bool(), Oversized: d.bool()}
	}
	if d.bool() {
		r.Clocks = &Clocks{ArmBoot: d.str(), Armed: time.Duration(d.v()), WriteBoot: d.str(), Written: time.Duration(d.v()), ArmMark: d.time(), Mark: d.time(), SendWall: d.time(), SendBoot: d.str(), SendBy: time.Duration(d.v())}
	}
	r.Tombstone, r.Holder, r.Redirected, r.HandedOut = d.bool(), d.str(), d.bool(), d.bool()
	if d.err != nil {
		return nil
	}
	if r.Version != FormatVersion {
		d.fail("record version")
		return nil
	}
	if err := r.Validate(); err != nil {
		d.err = err
		return nil
	}
	return r
}
