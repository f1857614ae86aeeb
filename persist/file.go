package persist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem/persist/internal/fsys"
)

// FileStore is the default Store. It keeps one file per intent, in a
// directory of its own. Each Write is durable before it returns.
// docs/PERSIST.md tells the layout, the durability scheme and the locking.
// It tells too what happens to damaged files.
//
// A FileStore holds an exclusive lock on its directory from OpenDir to
// Close. It keeps the unresolved records in memory. The index holds them,
// and OpenDir reads them from it (see docs/PERSIST.md). A resolved
// record is read from its file each time it is asked for. A FileStore is
// safe for concurrent use by multiple goroutines.
type FileStore struct {
	fs   fsys.FS
	dir  string
	opts Options
	lock io.Closer

	// syncs counts fsync calls, for the benchmarks. indexSyncs counts
	// those made to write the index, never on the path of a Write.
	syncs      atomic.Int64
	indexSyncs atomic.Int64
	// dirSync shares syncs of the directory between concurrent saves.
	dirSync *groupSync

	mu      sync.Mutex
	closed  bool
	entries map[string]*entry // by stem of the key; stray files by "?" + name
	// scanned is set once entries holds every entry of the directory.
	// After an OpenDir from the index, entries hold the unresolved ones
	// until the listing in the background ends.
	scanned   bool
	fromIndex bool // OpenDir read the index
	// indexed is set while the index is in place. changes counts the
	// changes of records. So writeIndex tells one made while it worked.
	indexed bool
	changes int
	// known is the set of entries the store knew when it wrote the
	// index OpenDir read: their count and their names' digest.
	known nameSet
	// listing is closed when the background listing of an OpenDir from
	// the index ends. It is nil when none runs. Every write waits for it
	// (see complete). Close does too, as it is in inflight.
	listing  chan struct{}
	inflight sync.WaitGroup // methods that write, waited for by Close
	// deferred counts the deferred writes (WithDeferredSync) whose
	// directory sync is to come. flushing is set while a flush runs.
	// flushErr is why the last one failed.
	deferred int
	flushing bool
	flushErr error
}

// entry is what the store knows of one key's file.
type entry struct {
	name string // the file that holds the record
	p    parsedName
	mode fs.FileMode // the type bits from the directory listing
	// st is the file's stamp when the store wrote or read rec. It is the
	// zero Stamp if the store did neither. The index holds a record only
	// with the stamp of the file it came from.
	st fsys.Stamp
	// twin is set on each file of a key that has two. This store never
	// writes a second one. Neither is trusted while both exist. Each is
	// damage of the action its name tags. The first in name order is
	// the key's entry, the others are filed by "?" + name.
	twin bool
	// rec is the record while it is unresolved. A resolved record is not
	// kept. resolved says so, and its file is read when asked for.
	rec      *Record
	resolved bool
	corrupt  *CorruptError
}

// mayHold reports whether e may hold a record that f selects, without
// reading its file. tag is nameTag(f.Name).
func (e *entry) mayHold(f Filter, tag string) bool {
	if f.Unresolved && e.resolved {
		return false
	}
	// A stray file belongs to no key, hence to no action. A file of a
	// key with two files keeps its key and tag: it may be that action's.
	return f.Name == "" || e.p.id != "" && e.p.tag == tag
}

// OpenDir opens the store in dir. It creates dir with mode 0700 if it
// does not exist. It reads the unresolved records from the index if the
// index describes the directory. Otherwise it lists the directory, reads
// them from their files and writes the index. opts may be nil.
//
// OpenDir returns an error matching ErrLocked if another store has dir
// open, in this process or another. On Unix systems, dir may exist with a
// mode that gives group or others some access. OpenDir's error then names
// dir, its mode and the fix. OpenDir fails too if dir cannot be created,
// locked or read. A record that cannot be read is not an error of
// OpenDir. List and Get report it.
func OpenDir(dir string, opts *Options) (*FileStore, error) {
	if dir == "" {
		return nil, errors.New("persist: no store directory given")
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return openDir(fsys.OS{}, dir, opts)
}

// openDir opens the store in dir, an absolute path, on the file system fsy.
func openDir(fsy fsys.FS, dir string, opts *Options) (*FileStore, error) {
	if err := mkdirAll(fsy, dir); err != nil {
		return nil, fmt.Errorf("persist: cannot create store directory %s: %w", dir, err)
	}
	fi, err := fsy.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("persist: cannot open store directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("persist: store directory %s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" && runtime.GOOS != "plan9" {
		return nil, fmt.Errorf("%w: %s has mode %04o; run chmod 0700 on it or use a new directory", errInsecureDir, dir, perm)
	}

	lk, err := fsy.Lock(dir)
	if errors.Is(err, fsys.ErrLocked) {
		return nil, fmt.Errorf("%w: %s is open elsewhere (%v); close the other store first or use another directory", ErrLocked, dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("persist: cannot lock store directory %s: %w", dir, err)
	}

	s := &FileStore{fs: fsy, dir: dir, lock: lk, dirSync: newGroupSync()}
	if opts != nil {
		s.opts = *opts
	}
	if err := s.loadIndex(); err == nil {
		// The writes need every entry of the directory: listed now,
		// after OpenDir returns, rather than by the first of them.
		s.fromIndex = true
		s.listing = make(chan struct{})
		s.inflight.Add(1)
		go s.listInBackground()
		return s, nil
	}
	s.entries = nil
	if err := s.scan(); err != nil {
		_ = lk.Close()
		return nil, err
	}
	// So that the next OpenDir starts from the index. It may fail: that
	// costs the next OpenDir a scan.
	_ = s.writeIndex()
	return s, nil
}

// complete makes entries hold every entry of the directory. After an
// OpenDir from the index, it waits for the listing in the background. If
// that failed, it lists the directory itself. s.mu must be held. It is
// released while complete waits. complete returns an error matching
// ErrClosed if the store was closed meanwhile. Only a Get or List can see
// that, as Close waits for the writes.
func (s *FileStore) complete() error {
	for !s.scanned {
		if s.listing == nil {
			return s.scan()
		}
		ch := s.listing
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
		if s.entries == nil {
			return fmt.Errorf("%w: %s", ErrClosed, s.dir)
		}
	}
	return nil
}

// listInBackground lists the directory for an OpenDir from the index. It
// also removes the temporary files a crash left. Every write waits for
// it. So what it lists stays true until it merges it into entries. It is
// counted in inflight, so nothing of it touches the directory after Close
// returns. A failure leaves entries as they are. The next write then lists
// the directory itself.
func (s *FileStore) listInBackground() {
	defer s.inflight.Done()
	l, names, err := s.list()
	s.mu.Lock()
	defer s.mu.Unlock()
	if l != nil && err == nil {
		s.merge(l, names)
	}
	close(s.listing)
	s.listing = nil
}

// mkdirAll creates dir and any missing parent with mode 0700. It syncs
// the parent of each directory it creates. So a store directory created
// here does not vanish in a power cut with the records saved in it.
func mkdirAll(fsy fsys.FS, dir string) error {
	fi, err := fsy.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirAll(fsy, parent); err != nil {
			return err
		}
	}
	if err := fsy.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return fsy.SyncDir(parent)
}

// scan lists the directory and merges what it finds into entries. It
// removes the temporary files a crash left (see list). OpenDir runs it,
// or a caller holding s.mu.
func (s *FileStore) scan() error {
	l, names, err := s.list()
	if err != nil {
		return err
	}
	s.merge(l, names)
	return nil
}

// list lists the directory's record files by key, and returns the set
// of their names too. It removes the
// temporary files a crash left. They were never renamed, so they never
// held a saved record. No other store can write them while we hold the
// lock. No write of this store has begun either. Every write calls
// complete first, which waits for a listing in the background. list
// needs no lock, as it reads nothing of s that changes.
func (s *FileStore) list() (map[string]*entry, nameSet, error) {
	var names nameSet
	des, err := s.fs.ReadDir(s.dir)
	if err != nil {
		return nil, names, fmt.Errorf("persist: cannot read store directory %s: %w", s.dir, err)
	}
	l := make(map[string]*entry, len(des))
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, tempPrefix) {
			_ = s.fs.Remove(filepath.Join(s.dir, name))
			continue
		}
		p, ok := parseName(name)
		if !ok {
			continue
		}
		names.add(name)
		e := &entry{name: name, p: p, mode: de.Type()}
		id := p.id
		if first := l[id]; id != "" && first != nil {
			// Two files of one key: neither may be taken for it. The
			// first in name order keeps the key's place.
			first.twin, e.twin = true, true
			if name < first.name {
				l[id], e = e, first
			}
		}
		if id == "" || e.twin {
			id = "?" + e.name
		}
		l[id] = e
	}
	return l, names, nil
}

// merge makes entries those of l, whose set of names is names. It keeps
// an entry already known with the same file, from the index. After an
// OpenDir from the index, the directory may hold the very files the index
// was built from: as many, with the same names' digest. Then every other entry is resolved, as the
// index holds every unresolved one. Otherwise the index describes another
// directory, and merge reads the other entries' files. OpenDir runs it,
// or a caller holding s.mu.
func (s *FileStore) merge(l map[string]*entry, names nameSet) {
	var unread []*entry
	indexed := s.fromIndex && names == s.known
	for id, e := range l {
		k := s.entries[id]
		switch {
		case k != nil && k.name == e.name && k.twin == e.twin:
			l[id] = k
		case indexed && e.p.id != "" && !e.twin:
			e.resolved = true
		default:
			unread = append(unread, e)
		}
	}
	s.readAll(unread)
	s.entries = l
	s.scanned = true
}

// readAll reads the records of ents, on a few threads. At a scan, the
// reads are most of OpenDir's cost.
func (s *FileStore) readAll(ents []*entry) {
	n := min(runtime.GOMAXPROCS(0), 4, len(ents)/64+1)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for i := w; i < len(ents); i += n {
				s.record(ents[i])
			}
		})
	}
	wg.Wait()
}

// record returns e's record: the one kept, or read from its file. A
// record read that is unresolved is kept, with the file's stamp. record
// touches e alone, so callers may read several entries at once. s.mu
// must keep others out.
func (s *FileStore) record(e *entry) (*Record, *CorruptError) {
	if e.rec != nil || e.corrupt != nil {
		return e.rec, e.corrupt
	}
	var data []byte
	var err error
	var st fsys.Stamp
	path := filepath.Join(s.dir, e.name)
	switch {
	case e.twin:
		err = errors.New("another file holds the same key (this store writes one): neither is trusted; Quarantine the one that is not the intent")
	case e.p.id == "":
		err = errors.New("the file name spells no key: it is not a name this store writes")
	case !e.mode.IsRegular():
		err = fmt.Errorf("not a regular file (%v)", e.mode)
	default:
		// Stamped before it is read. A change after the stamp then
		// shows as another stamp at the next OpenDir from the index.
		st, _ = s.fs.Stamp(path)
		data, err = s.fs.ReadFile(path, maxRecordFile)
	}
	var r *Record
	if err == nil {
		r, err = decodeFile(e.p, data)
	}
	if err != nil {
		e.corrupt = &CorruptError{Path: path, Key: e.p.key(), Err: err}
		return nil, e.corrupt
	}
	e.resolved = r.State.Resolved()
	if !e.resolved {
		e.rec, e.st = r, st
	}
	return r, nil
}

// recordCopy returns a copy of e's record that the caller owns.
func (s *FileStore) recordCopy(e *entry) (*Record, *CorruptError) {
	r, ce := s.record(e)
	if r != nil && r == e.rec {
		r = r.Clone()
	}
	return r, ce
}

// lockOpen locks s.mu unless ctx is done or the store is closed.
func (s *FileStore) lockOpen(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrClosed, s.dir)
	}
	return nil
}

// begin registers a method that writes, so that Close waits for it. The
// caller must call s.inflight.Done when begin returns nil.
func (s *FileStore) begin(ctx context.Context) error {
	if err := s.lockOpen(ctx); err != nil {
		return err
	}
	s.inflight.Add(1)
	s.mu.Unlock()
	return nil
}

// syncDir makes the directory's entries (renames and removals) durable.
func (s *FileStore) syncDir() error {
	s.syncs.Add(1)
	return s.fs.SyncDir(s.dir)
}

// Get returns a copy of the record for key, or an error matching
// ErrNotFound. It returns the *CorruptError of an unreadable record.
func (s *FileStore) Get(ctx context.Context, key string) (*Record, error) {
	if err := s.lockOpen(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	// Not known yet: perhaps not listed yet.
	id := stem(key)
	if s.entries[id] == nil {
		if err := s.complete(); err != nil {
			return nil, err
		}
	}
	e := s.entries[id]
	if e == nil {
		return nil, fmt.Errorf("%w: key %q in %s", ErrNotFound, key, s.dir)
	}
	r, ce := s.recordCopy(e)
	if ce != nil {
		return nil, ce
	}
	return r, nil
}

// List returns copies of the records selected by f. They come oldest
// CreatedAt first, and by Key among equals. The unresolved records are
// in memory. With f.Name set, List reads only the files whose names carry
// the Name's tag.
//
// List reports a file that cannot be read if it may hold a selected
// record. Its error joins a *CorruptError for each, in path order.
// CorruptErrors returns them all. With f.Name set, a damaged file of
// another action is not reported, and does not fail the call. A stray
// file, whose name spells no key, is reported only when f.Name is empty.
func (s *FileStore) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := s.lockOpen(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if !f.Unresolved {
		if err := s.complete(); err != nil {
			return nil, err
		}
	}
	out, err := s.selectLocked(f, s.recordCopy)
	sortRecords(out)
	return out, err
}

// selectLocked returns the records f selects, each got by get, and the
// error of the damaged files that may hold one. s.mu must be held.
func (s *FileStore) selectLocked(f Filter, get func(*entry) (*Record, *CorruptError)) ([]*Record, error) {
	var out []*Record
	var corrupt []*CorruptError
	tag := nameTag(f.Name)
	for _, e := range s.entries {
		if !e.mayHold(f, tag) {
			continue
		}
		r, ce := get(e)
		switch {
		case ce != nil:
			corrupt = append(corrupt, ce)
		case f.match(r):
			out = append(out, r)
		}
	}
	return out, joinCorrupt(corrupt)
}

// joinCorrupt returns the errors in path order: nil, the one, or joined.
func joinCorrupt(cs []*CorruptError) error {
	slices.SortFunc(cs, func(a, b *CorruptError) int { return strings.Compare(a.Path, b.Path) })
	switch len(cs) {
	case 0:
		return nil
	case 1:
		return cs[0]
	}
	errs := make([]error, len(cs))
	for i, c := range cs {
		errs[i] = c
	}
	return errors.Join(errs...)
}

// Close waits for the saves and deletes in progress. It writes the index
// if none is in place. A failure there costs the next OpenDir a scan, and
// is not an error. Close then releases the directory's lock. Methods
// called after Close return an error matching ErrClosed. Closing again
// does nothing.
func (s *FileStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	s.mu.Lock()
	var flushErr error
	if s.deferred > 0 {
		// The last flush failed: one more try, and say so if it fails.
		s.flushing = true
		s.inflight.Add(1)
		s.mu.Unlock()
		s.flush()
		s.mu.Lock()
		if s.deferred > 0 {
			flushErr = fmt.Errorf("persist: %d intents saved in %s may not survive a power loss (directory sync failed): %w", s.deferred, s.dir, s.flushErr)
		}
	}
	s.mu.Unlock()
	_ = s.writeIndex()
	s.mu.Lock()
	s.entries = nil
	s.mu.Unlock()
	if err := s.lock.Close(); err != nil {
		return errors.Join(flushErr, fmt.Errorf("persist: cannot release the lock on %s: %w", s.dir, err))
	}
	return flushErr
}
