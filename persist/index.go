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
// removes it before any change of a record (see change). docs/PERSIST.md
// ("The index") says why it can be trusted, and when it is not.
const (
	indexFile = "index"
	// indexMagic starts every index file. The byte after it is
	// indexVersion. An index of another version is rebuilt, never read.
	indexMagic   = "idem-persist-index\n"
	indexVersion = 9
	// maxIndexFile bounds the index's size. A larger index is not used:
	// OpenDir scans, and the store writes none that large. The index
	// holds the unresolved records, a handful on a device. So 64 MiB is
	// far above any real one. A damaged or hostile index, a sparse file
	// of any size, then costs no allocation of its size.
	maxIndexFile = 64 << 20
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errIndex is why an index is not used or not written. It never reaches
// a caller.
var errIndex = errors.New("index not usable")

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
	data, err := s.fs.ReadFile(path, maxIndexFile)
	if err != nil {
		return err
	}
	d, known, files, err := decodeIndexFiles(data)
	if err != nil {
		return err
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.name
	}
	// The files are stamped while the records are decoded. The system
	// calls are most of the cost.
	var now []fsys.Stamp
	var stampErr error
	done := make(chan struct{})
	go func() { defer close(done); now, stampErr = s.fs.Stamps(s.dir, names) }()
	err = indexEntries(d, files)
	<-done
	if err != nil {
		return err
	}
	if stampErr != nil {
		return stampErr
	}
	if err := s.useIndex(files, now, idxSt); err != nil {
		return err
	}
	s.known, s.indexed = known, true
	return nil
}

// nameSet is an order-independent digest of a set of file names: their
// count, and the sum, mod 2^64, of each name's 64-bit hash. The listing
// is not sorted, so the digest must not depend on order. It costs no stat
// and no read. The index keeps the digest of the names it was built from.
// A directory whose names give another digest is not the one the index
// describes, even with as many files. Another store's index, or a file
// removed and another put in, then shows.
type nameSet struct {
	n   int
	sum uint64
}

// add adds name to the set.
func (d *nameSet) add(name string) {
	d.n++
	d.sum += nameHash(name)
}

// nameHash is FNV-1a over name's 8-byte words, its length mixed in
// first, then MurmurHash3's 64-bit finalizer. Byte by byte, FNV-1a cost
// an open from the index of 10,000 files about 4% more CPU; by words, a
// fifth of that. The finalizer spreads each bit over the whole hash, as
// FNV's multiply carries bits upward only.
func nameHash(name string) uint64 {
	const prime = 1099511628211 // FNV's 64-bit prime
	h := uint64(14695981039346656037) ^ uint64(len(name))
	for ; len(name) >= 8; name = name[8:] {
		h ^= binary.LittleEndian.Uint64([]byte(name[:8]))
		h *= prime
	}
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= prime
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// indexEntries decodes the records that follow files in d, and checks
// each entry. Its name must be a record file's. Its record, if any, must
// be unresolved. It must belong to the file, as a record read from the
// file must. An index may be damaged past its checksum, or copied from
// another store. It must never report a record under another key, or in
// another state, than its file holds.
func indexEntries(d *codec, files []entry) error {
	for i := range files {
		e := &files[i]
		p, ok := parseName(e.name)
		if !ok {
			return fmt.Errorf("%w: %s is not a record file's name", errIndex, e.name)
		}
		e.p = p
		if e.rec == nil {
			e.st = fsys.Stamp{} // a stamp is trusted only with its record
			continue
		}
		if d.record(e.rec); d.err != nil {
			return d.err
		}
		if err := checkIndexed(e); err != nil {
			return fmt.Errorf("%w: %s: %w", errIndex, e.name, err)
		}
	}
	if d.s != "" {
		return fmt.Errorf("%w: bytes in excess", errIndex)
	}
	return nil
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
func (s *FileStore) useIndex(files []entry, now []fsys.Stamp, idxSt fsys.Stamp) error {
	entries := make(map[string]*entry, len(files))
	var reread []*entry
	for i := range files {
		e, st := &files[i], now[i]
		switch {
		case st == (fsys.Stamp{}):
			return fmt.Errorf("%w: %s is missing", errIndex, e.name)
		case st != e.st || st.Change >= idxSt.Change:
			// Changed since: read the file. Its type may have changed
			// too, a link replaced by a regular file. So the index's
			// type is not used: ReadFile checks the open file's own.
			e.rec, e.st, e.mode = nil, fsys.Stamp{}, 0
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
	var known nameSet
	var files []entry
	for _, e := range s.entries {
		known.add(e.name)
		if e.resolved {
			continue
		}
		f := entry{name: e.name, mode: e.mode, twin: e.twin}
		if e.corrupt == nil && e.st != (fsys.Stamp{}) {
			// Only with the stamp the file had when its record was
			// read or written. A change since then must show.
			f.st, f.rec = e.st, e.rec
		}
		files = append(files, f)
	}
	s.mu.Unlock()
	if data = encodeIndex(known, files); len(data) > maxIndexFile {
		return 0, nil, fmt.Errorf("%w: %d bytes, over the limit of %d", errIndex, len(data), maxIndexFile)
	}
	return c, data, nil
}

// The index's encoding is flat: varints, and strings after their length.
// Decoding it was most of an open's time in gob. One list of a record's
// fields serves both ways (see codec). It has no field names. So TestIndex
// checks that a record with every field set comes back whole.

// encodeIndex returns the content of an index file: the magic, the
// version and a CRC-32C of the rest. Then come known, the set of the
// directory's record files, and the files, and last the files' records.
func encodeIndex(known nameSet, files []entry) []byte {
	c := &codec{b: append([]byte(indexMagic), indexVersion, 0, 0, 0, 0)}
	num(c, &known.n)
	c.uint(&known.sum)
	c.count(len(files), fileLeast)
	for i := range files {
		c.file(&files[i])
	}
	for _, f := range files {
		if f.rec != nil {
			c.record(f.rec)
		}
	}
	i := len(indexMagic) + 1
	binary.LittleEndian.PutUint32(c.b[i:i+4], crc32.Checksum(c.b[i+4:], crcTable))
	return c.b
}

// decodeIndexFiles checks an index file's version and checksum. It
// decodes known and the files, and leaves their records in c.
func decodeIndexFiles(data []byte) (c *codec, known nameSet, files []entry, err error) {
	rest, ok := bytes.CutPrefix(data, []byte(indexMagic))
	switch {
	case !ok || len(rest) < 5:
		return nil, known, nil, fmt.Errorf("%w: not an index file", errIndex)
	case rest[0] != indexVersion:
		return nil, known, nil, fmt.Errorf("%w: index version %d", errIndex, rest[0])
	case crc32.Checksum(rest[5:], crcTable) != binary.LittleEndian.Uint32(rest[1:5]):
		return nil, known, nil, fmt.Errorf("%w: checksum mismatch", errIndex)
	}
	// One string for the whole index: the records' strings share it.
	c = &codec{s: string(rest[5:]), read: true}
	if num(c, &known.n); known.n < 0 {
		c.fail()
	}
	c.uint(&known.sum)
	files = make([]entry, c.count(0, fileLeast))
	for i := 0; i < len(files) && c.err == nil; i++ {
		c.file(&files[i])
	}
	return c, known, files, c.err
}

// codec writes the index's values to b, or reads them from s. Each of its
// methods does one or the other, so one list of fields serves both ways.
// Writing never stores to what it is given: the records are shared. The
// first failure to read sticks in err. Every read after it gives zeros.
type codec struct {
	b    []byte
	s    string
	read bool
	err  error
}

func (c *codec) fail() {
	if c.err == nil {
		c.err = fmt.Errorf("%w: truncated or malformed", errIndex)
	}
	c.s = ""
}

func (c *codec) uint(p *uint64) {
	if !c.read {
		c.b = binary.AppendUvarint(c.b, *p)
		return
	}
	for i, v := 0, uint64(0); i < len(c.s) && i < binary.MaxVarintLen64; i++ {
		v |= uint64(c.s[i]&0x7f) << (7 * i)
		if c.s[i] < 0x80 {
			*p, c.s = v, c.s[i+1:]
			return
		}
	}
	c.fail()
	*p = 0
}

// count writes or reads n, a count of the items that follow. Each takes
// least bytes at least. So a count of more than what is left holds is
// damage. It is refused before anything is allocated for it: an item
// decoded takes many times the bytes it is encoded in.
func (c *codec) count(n, least int) int {
	u := uint64(n)
	if c.uint(&u); c.read && u > uint64(len(c.s)/least) {
		c.fail()
		return 0
	}
	return int(u)
}

// num writes or reads a signed number, zig-zagged as binary.AppendVarint
// does.
func num[T ~int | ~int64](c *codec, p *T) {
	v := int64(*p)
	u := uint64(v<<1) ^ uint64(v>>63)
	c.uint(&u)
	if c.read {
		*p = T(int64(u>>1) ^ -int64(u&1))
	}
}

// str writes or reads a string after its length.
func str[T ~string](c *codec, p *T) {
	n := uint64(len(*p))
	c.uint(&n)
	switch {
	case !c.read:
		c.b = append(c.b, *p...)
	case n > uint64(len(c.s)):
		c.fail()
	default:
		*p, c.s = T(c.s[:n]), c.s[n:]
	}
}

func (c *codec) bool(p *bool) {
	var u uint64
	if *p {
		u = 1
	}
	c.uint(&u)
	if c.read {
		*p = u == 1
		if u > 1 {
			c.fail()
		}
	}
}

// bytes writes or reads a byte slice. An empty one reads back nil, as
// normalize keeps it.
func (c *codec) bytes(p *[]byte) {
	s := string(*p)
	str(c, &s)
	if c.read && s != "" {
		*p = []byte(s)
	}
}

// time writes or reads t in time.Time's binary form, which keeps its
// instant and its zone's offset.
func (c *codec) time(p *time.Time) {
	m, _ := p.MarshalBinary() // fails only for an offset out of range
	s := string(m)
	str(c, &s)
	if c.read && p.UnmarshalBinary([]byte(s)) != nil {
		c.fail()
	}
}

// header writes h's fields in name order, so the index's bytes depend on
// its content alone. A field without values reads back nil, as
// normHeader keeps it.
func (c *codec) header(h *http.Header) {
	keys := slices.Sorted(maps.Keys(*h))
	// A field takes its name's length and its count of values at least.
	if n := c.count(len(keys), 2); c.read && n > 0 {
		keys, *h = make([]string, n), make(http.Header, n)
	}
	for _, k := range keys {
		vs := (*h)[k]
		str(c, &k)
		if m := c.count(len(vs), 1); c.read && m > 0 {
			vs = make([]string, m)
		}
		for i := range vs {
			str(c, &vs[i])
		}
		if c.read {
			(*h)[k] = vs
		}
	}
}

// fileLeast is the fewest bytes a file of the index takes: one for each
// of the eight values file writes, an empty name's length included.
const fileLeast = 8

// file writes or reads a file of the index. Its record comes later.
func (c *codec) file(e *entry) {
	str(c, &e.name)
	mode := uint64(e.mode)
	c.uint(&mode)
	c.uint(&e.st.Ino)
	num(c, &e.st.Size)
	num(c, &e.st.Mod)
	num(c, &e.st.Change)
	c.bool(&e.twin)
	has := e.rec != nil
	c.bool(&has)
	if c.read {
		e.mode = fs.FileMode(mode)
		if has {
			e.rec = &Record{} // filled by record
		}
	}
}

// record writes or reads every field of r.
func (c *codec) record(r *Record) {
	num(c, &r.Version)
	for _, p := range []*string{&r.Rev, &r.Key, &r.Name, &r.Method, &r.URL, &r.Fingerprint, &r.KeyHeader, &r.Holder} {
		str(c, p)
	}
	c.header(&r.Header)
	c.bytes(&r.Body)
	c.uint(&r.Seq)
	c.time(&r.CreatedAt)
	c.time(&r.UpdatedAt)
	str(c, &r.State)
	num(c, &r.Attempts)
	for _, p := range []*bool{&r.Tombstone, &r.Redirected, &r.HandedOut} {
		c.bool(p)
	}
	has := r.Response != nil
	if c.bool(&has); has {
		if c.read {
			r.Response = &Response{}
		}
		p := r.Response
		num(c, &p.StatusCode)
		c.header(&p.Header)
		c.bytes(&p.Body)
		c.bool(&p.Replayed)
		c.bool(&p.Oversized)
	}
	has = r.Clocks != nil
	if c.bool(&has); has {
		if c.read {
			r.Clocks = &Clocks{}
		}
		k := r.Clocks
		for _, p := range []*string{&k.ArmBoot, &k.WriteBoot, &k.SendBoot} {
			str(c, p)
		}
		for _, p := range []*time.Duration{&k.Armed, &k.Written, &k.SendBy} {
			num(c, p)
		}
		for _, p := range []*time.Time{&k.ArmMark, &k.Mark, &k.SendWall} {
			c.time(p)
		}
	}
}
