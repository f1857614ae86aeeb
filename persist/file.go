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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/persist/internal/fsys"
)

// FileStore is the default Store: one file per intent in a directory of its
// own, each Write made durable before it returns. See the package docs for the
// layout, the durability scheme, the locking and what happens to damaged
// files.
//
// A FileStore holds an exclusive lock on its directory from OpenDir to
// Close. It keeps every record it has read in memory: the unresolved
// records are read at OpenDir (from the index when it describes the
// directory, see the package docs), those of resolved records the first
// time Get, List or Prune needs them, and none is read twice. A FileStore
// is safe for concurrent use by multiple goroutines.
type FileStore struct {
	fs   fsys.FS
	dir  string
	opts Options
	lock io.Closer

	// syncs counts fsync calls, for the benchmarks; indexSyncs those
	// made before writing the index, never on the path of a Write.
	syncs      atomic.Int64
	indexSyncs atomic.Int64
	// gen counts the changes this store made to the directory's entries,
	// twice each: before and after; changing is how many are under way.
	// The index is written only while neither moves (see writeIndex).
	gen      atomic.Int64
	changing atomic.Int64
	// dirSync shares syncs of the directory between concurrent saves.
	dirSync *groupSync

	mu      sync.Mutex
	closed  bool
	entries map[string]*entry // by stem of the key; stray files by "?" + name
	// scanned is set once entries holds every entry of the directory;
	// until then (after an OpenDir from the index) it holds those that may
	// hold an unresolved record. indexGen is gen when the index in place
	// was written or read, -1 if there is none.
	scanned   bool
	indexGen  int64
	fromIndex bool // OpenDir read the index
	// listing is closed when the listing of the directory that an
	// OpenDir from the index starts in the background ends; nil when
	// none runs. Every write waits for it (see complete), and Close too,
	// as it is counted in inflight.
	listing  chan struct{}
	inflight sync.WaitGroup // methods that write, waited for by Close
	// deferred are the deferred writes (WithDeferredSync) whose directory sync is to
	// come; flushing is set while a flush runs; flushErr is why the last
	// one failed.
	deferred []deferredSave
	flushing bool
	flushErr error
}

// entry is what the store knows of one intent's files: the record, or why it
// cannot be read, or (for a resolved record not asked for yet) neither.
type entry struct {
	// files are the intent's files; files[0] holds the record. More than
	// one is left only by a save, delete or prune cut short, or by a save
	// that could not remove an older version; the others are older
	// versions, removed on the next write of the key. See winsOver.
	files   []file
	rec     *Record // nil until read, or if unreadable
	corrupt *CorruptError
}

// file is one file of an entry.
type file struct {
	name string
	p    parsedName
	mode fs.FileMode // the type bits from the directory listing
	// st is the file's stamp when the store wrote or last read it, the
	// zero Stamp if it did neither: the index holds a record only with
	// the stamp of the file it came from.
	st fsys.Stamp
}

// winsOver reports whether a, found next to b for the same key at OpenDir,
// holds the record rather than b. A resolved file wins over an unresolved
// one: Write removes an unresolved file after syncing its resolved version
// in, without syncing the removal. Between files of the same resolution,
// left only by a save that did not return, either is a valid outcome; the
// greater name wins so that the choice is the same on every open.
func winsOver(a, b file) bool {
	if a.p.resolved != b.p.resolved {
		return a.p.resolved
	}
	return a.name > b.name
}

// mayHold reports whether e may hold a record that f selects, judging by
// its files' names alone; tag is filterTag(f).
func (e *entry) mayHold(f Filter, tag string) bool {
	for _, fl := range e.files {
		if fl.p.mayHold(f, tag) {
			return true
		}
	}
	return false
}

// stale returns e's files other than name, the older versions first and
// the file that holds the record last: removed in this order, a crash in
// between leaves the record or nothing, never an older version.
func (e *entry) stale(name string) []file {
	var out []file
	for _, fl := range append(slices.Clone(e.files[1:]), e.files[0]) {
		if fl.name != name {
			out = append(out, fl)
		}
	}
	return out
}

// OpenDir opens the store in dir, creating dir with mode 0700 if it does not
// exist. It reads the unresolved records, from the index if it describes
// the directory, else from their files after listing the directory (and
// then writes the index); resolved records are read when first asked
// for. opts may be nil.
//
// OpenDir returns an error matching ErrLocked if another store, in this or
// another process, has dir open; an error that names dir, its mode and the
// fix if dir exists and its mode gives group or others any access (on Unix
// systems); and an error if dir cannot be created, locked or read. A
// record that cannot be read is not an error of OpenDir: List and Get
// report it.
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
	// So that the next OpenDir starts from the index. It may fail, or
	// give up: that costs the next OpenDir a scan.
	s.indexGen = -1
	_ = s.writeIndex()
	return s, nil
}

// changeDir runs fn, a change of the directory's entries, counted in gen
// and changing.
func (s *FileStore) changeDir(fn func() error) error {
	s.changing.Add(1)
	s.gen.Add(1)
	defer func() {
		s.gen.Add(1)
		s.changing.Add(-1)
	}()
	return fn()
}

// rename, removeFile and createTemp change the directory through
// changeDir.
func (s *FileStore) rename(oldpath, newpath string) error {
	return s.changeDir(func() error { return s.fs.Rename(oldpath, newpath) })
}

func (s *FileStore) removeFile(path string) error {
	return s.changeDir(func() error { return s.fs.Remove(path) })
}

func (s *FileStore) createTemp() (f fsys.File, err error) {
	err = s.changeDir(func() error {
		f, err = s.fs.CreateTemp(s.dir, tempPrefix+"*")
		return err
	})
	return f, err
}

// complete makes entries hold every entry of the directory, scanning it
// if OpenDir read the index instead: it waits for the listing OpenDir
// started in the background, and lists the directory itself if that
// failed. s.mu must be held; it is released while complete waits. It
// returns an error matching ErrClosed if the store was closed meanwhile
// (only a Get or List can be: Close waits for the writes).
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

// listInBackground lists the directory for an OpenDir from the index,
// unless the store is closed first. It runs before any write of the
// store (they wait for it), so what it lists stays true until it has
// merged it into entries, and it is counted in inflight, so that it
// ends before Close does: nothing of it touches the directory after
// Close returns. A failure leaves entries as they are, and the next
// write lists the directory itself.
func (s *FileStore) listInBackground() {
	defer s.inflight.Done()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	s.removeIndexTemps()
	var l *listing
	var err error
	if !closed {
		l, err = s.list()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l != nil && err == nil {
		s.merge(l)
	}
	close(s.listing)
	s.listing = nil
}

// mkdirAll creates dir and any missing parent with mode 0700, and syncs the
// parent of each directory it creates, so that a store directory created
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

// scan reads the directory, and the file of every record that may be
// unresolved and is not in entries already with the same files (read from
// the index); the files of resolved records are read when asked for. It
// removes the temporary files a crash left (see list). Run by OpenDir,
// or under s.mu.
func (s *FileStore) scan() error {
	s.removeIndexTemps()
	l, err := s.list()
	if err != nil {
		return err
	}
	s.merge(l)
	return nil
}

// listing is what list found in the directory: its record files by
// entry, each entry's files in winsOver order, and the entries' ids in
// the order found.
type listing struct {
	entries map[string]*entry
	ids     []string
}

// list lists the directory's record files, and removes the temporary
// files a crash left: they were never renamed, so they were never a saved
// record, and no other store can be writing them while we hold the lock
// and no write of this one has begun (every write calls complete first,
// which waits for a listing in the background). It needs no lock: it
// reads nothing of s that changes.
func (s *FileStore) list() (*listing, error) {
	des, err := s.fs.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("persist: cannot read store directory %s: %w", s.dir, err)
	}
	l := &listing{entries: make(map[string]*entry, len(des))}
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, tempPrefix) {
			_ = s.removeFile(filepath.Join(s.dir, name))
			continue
		}
		p, ok := parseName(name)
		if !ok {
			continue
		}
		id := p.id
		if id == "" {
			id = "?" + name
		}
		e := l.entries[id]
		if e == nil {
			e = &entry{}
			l.entries[id] = e
			l.ids = append(l.ids, id)
		}
		e.files = append(e.files, file{name: name, p: p, mode: de.Type()})
	}
	for _, id := range l.ids {
		slices.SortFunc(l.entries[id].files, func(a, b file) int {
			if winsOver(a, b) {
				return -1
			}
			return 1
		})
	}
	return l, nil
}

// removeIndexTemps removes the temporary files of index writes cut
// short, at every OpenDir (in the background after one from the index):
// no index is written until entries are complete, after it. Each
// interrupted write leaves one file and each open removes them all, so
// they never pile up; a failure costs nothing but the space until the
// next open.
func (s *FileStore) removeIndexTemps() {
	dir := filepath.Join(s.dir, indexDir)
	des, err := s.fs.ReadDir(dir)
	if err != nil {
		return
	}
	for _, de := range des {
		if strings.HasPrefix(de.Name(), tempPrefix) {
			_ = s.fs.Remove(filepath.Join(dir, de.Name()))
		}
	}
}

// merge makes entries those of l, keeping the entries already known with
// the same files (read from the index) and reading the files of the
// others that may hold an unresolved record. Run by OpenDir, or under
// s.mu.
func (s *FileStore) merge(l *listing) {
	known := s.entries
	for _, id := range l.ids {
		e := l.entries[id]
		if k := known[id]; k != nil && slices.EqualFunc(k.files, e.files, func(a, b file) bool { return a.name == b.name }) {
			l.entries[id] = k
			continue
		}
		if e.mayHold(Filter{Unresolved: true}, "") {
			s.read(e)
		}
	}
	s.entries = l.entries
	s.scanned = true
}

// read reads e's record from its file, once.
func (s *FileStore) read(e *entry) {
	if e.rec != nil || e.corrupt != nil {
		return
	}
	fl := e.files[0]
	var data []byte
	var err error
	switch {
	case fl.p.id == "":
		err = errors.New("the file name spells no key: it is not a name this store writes")
	case !fl.mode.IsRegular():
		err = fmt.Errorf("not a regular file (%v)", fl.mode)
	default:
		// Stamped before it is read: a change after the stamp shows
		// as another stamp at the next OpenDir from the index.
		path := filepath.Join(s.dir, fl.name)
		if e.files[0].st == (fsys.Stamp{}) {
			e.files[0].st, _ = s.fs.Stamp(path)
		}
		data, err = s.fs.ReadFile(path)
	}
	if err == nil {
		e.rec, err = decodeFile(fl.p, data)
	}
	if err != nil {
		e.corrupt = &CorruptError{Path: filepath.Join(s.dir, fl.name), Key: fl.p.key, Err: err}
	}
}

// begin registers a method that writes, so that Close waits for it. The
// caller must call s.inflight.Done when begin returns nil.
func (s *FileStore) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: %s", ErrClosed, s.dir)
	}
	s.inflight.Add(1)
	return nil
}

// Write writes rec durably if the stored records allow it (see Store): it
// writes a temporary file, syncs it, renames it over the record's file and
// syncs the directory. The check is made before the temporary file is
// written, and again, in one step with the rename, after: of two writes
// racing for one version, or for one action's next Seq, one wins. When
// Write returns an error, the record's file is the previous version (or
// absent), except when only the final sync of the directory failed: then
// it is the new version, complete, but perhaps not yet safe from power
// loss, and the error says so.
//
// When a record becomes resolved its file is renamed to the resolved
// suffix: the new file is synced in, then the old one removed, at no extra
// sync. A record that goes back from resolved to unresolved, or whose Name
// changes (which idem's client never does), costs a third sync.
//
// With a ctx made by WithDeferredSync, when rec's file gets a new name
// (the record becomes resolved, say) and the new file would win over the
// old ones at OpenDir, Write returns before the directory is synced: the
// sync, and the removal of the old file after it, happen in the
// background, and Close waits for them. Until then a power loss may undo
// the rename, and the key holds its previous version, whole; the new file
// is never seen damaged, as it is synced before the rename.
//
// Write refuses to replace a record that cannot be read (see
// CorruptError): Quarantine it first.
func (s *FileStore) Write(ctx context.Context, rec, old *Record) error {
	if err := checkWrite(rec, old); err != nil {
		return err
	}
	r := prepare(rec, s.opts)
	data, err := encodeRecord(r)
	if err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.inflight.Done()
	deferred := DeferredSync(ctx)

	// Checked before writing, to spare the write when it would lose.
	id := stem(r.Key)
	s.mu.Lock()
	err = s.complete()
	if err == nil {
		err = s.writableLocked(r, old)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	tmp, err := s.writeTemp(data)
	if err != nil {
		return fmt.Errorf("persist: cannot save intent %q in %s (check free space and permissions; the previous version is intact): %w", r.Key, s.dir, err)
	}

	s.mu.Lock()
	locked := true
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	// Checked again, in one step with the rename and the update of the
	// entries: another write may have won since.
	if err := s.writableLocked(r, old); err != nil {
		_ = s.removeFile(tmp)
		return err
	}
	name := fileName(r.Key, r.Name, r.State.Resolved())
	p, _ := parseName(name)
	nf := file{name: name, p: p}
	path := filepath.Join(s.dir, name)
	if err := s.rename(tmp, path); err != nil {
		_ = s.removeFile(tmp)
		return fmt.Errorf("persist: cannot save intent %q to %s (the previous version is intact): %w", r.Key, path, err)
	}
	nf.st, _ = s.fs.Stamp(path) // for the index; zero if it fails
	prev := s.entries[id]
	ne := &entry{files: []file{nf}, rec: r}
	s.entries[id] = ne
	var stale []file
	if prev != nil {
		stale = prev.stale(name)
	}
	if len(stale) == 0 {
		// The common case. Any sync of the directory that starts after
		// the rename makes it durable, so concurrent saves share one.
		s.mu.Unlock()
		locked = false
		if err := s.dirSync.sync(s.syncDir); err != nil {
			return syncFailed(r.Key, path, err)
		}
		return nil
	}

	if deferred && !slices.ContainsFunc(stale, func(fl file) bool { return winsOver(fl, nf) }) {
		// The old files stay, listed after the new one, until the
		// directory is synced: a power loss before leaves the new file or
		// the old ones, and the new one wins whenever it is there.
		ne.files = append(ne.files, stale...)
		s.deferred = append(s.deferred, deferredSave{id: id, e: ne})
		if !s.flushing {
			s.flushing = true
			s.inflight.Add(1) // this save's own count keeps Close waiting
			go s.flush()
		}
		return nil
	}

	// The record's file has another name than before: sync the new file
	// in before the old ones go, so that a crash leaves one or both,
	// never neither. All under the lock, so no other save of the key runs
	// in between.
	if err := s.syncDir(); err != nil {
		return syncFailed(r.Key, path, err)
	}
	mustGo := false // an old file would win over the new one at OpenDir
	for _, fl := range stale {
		wins := winsOver(fl, nf)
		mustGo = mustGo || wins
		err := s.removeFile(filepath.Join(s.dir, fl.name))
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			continue
		}
		ne.files = append(ne.files, fl)
		if wins {
			return fmt.Errorf("persist: intent %q was saved to %s, but its old version %s cannot be removed and would take its place after a restart; remove that file: %w", r.Key, path, fl.name, err)
		}
	}
	if mustGo {
		// An old file that came back after a power loss would win.
		if err := s.syncDir(); err != nil {
			return syncFailed(r.Key, path, err)
		}
	}
	return nil
}

// deferredSave is a write made with WithDeferredSync whose directory sync is to
// come: e is the entry it made for id.
type deferredSave struct {
	id string
	e  *entry
}

// flush syncs the directory for the deferred saves, then removes the old
// files of those whose entry is still the one they made (a later save or
// delete of the key removed them itself), until none is left; then it
// writes the index, so that an app killed after an intent resolved opens
// from it. It runs in its own goroutine, counted in s.inflight. If the
// sync fails, the saves stay deferred: the next deferred write or Close
// tries again.
func (s *FileStore) flush() {
	defer s.inflight.Done()
	indexed := false
	for {
		s.mu.Lock()
		batch := s.deferred
		s.deferred = nil
		if len(batch) == 0 && !indexed {
			s.mu.Unlock()
			indexed = true
			_ = s.writeIndex()
			continue
		}
		if len(batch) == 0 {
			s.flushing = false
			s.mu.Unlock()
			return
		}
		indexed = false
		s.mu.Unlock()
		// Shared with the saves syncing the directory at the same time.
		err := s.dirSync.sync(s.syncDir)
		s.mu.Lock()
		if err != nil {
			s.deferred = append(batch, s.deferred...)
			s.flushErr = err
			s.flushing = false
			s.mu.Unlock()
			return
		}
		s.flushErr = nil
		for _, d := range batch {
			if s.entries[d.id] != d.e {
				continue
			}
			kept := d.e.files[:1]
			for _, fl := range d.e.files[1:] {
				if err := s.removeFile(filepath.Join(s.dir, fl.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					kept = append(kept, fl) // removed at the key's next write
				}
			}
			d.e.files = kept
		}
		s.mu.Unlock()
	}
}

func syncFailed(key, path string, err error) error {
	return fmt.Errorf("persist: intent %q was written to %s but may not survive a power loss (directory sync failed; do not send it yet, save again): %w", key, path, err)
}

// writableLocked returns nil if r may be written over old (see writable),
// judging by the stored records: the one stored with r.Key, and for a new
// intent of a Name, every record of that Name. A record it needs that
// cannot be read refuses the write with its *CorruptError. s.mu must be
// held, and entries complete.
func (s *FileStore) writableLocked(r, old *Record) error {
	var cur *Record
	if e := s.entries[stem(r.Key)]; e != nil {
		s.read(e)
		if e.corrupt != nil {
			return fmt.Errorf("persist: not replacing intent %q: its stored version is unreadable; Quarantine it first to replace it: %w", r.Key, e.corrupt)
		}
		cur = e.rec
	}
	var named []*Record
	if old == nil && r.Name != "" {
		f := Filter{Name: r.Name}
		tag := filterTag(f)
		var corrupt []*CorruptError
		for _, e := range s.entries {
			if !e.mayHold(f, tag) {
				continue
			}
			s.read(e)
			switch {
			case e.corrupt != nil:
				corrupt = append(corrupt, e.corrupt)
			case e.rec.Name == r.Name:
				named = append(named, e.rec)
			}
		}
		if len(corrupt) > 0 {
			// An unreadable record may be the action's latest.
			return joinCorrupt(corrupt)
		}
	}
	err := writable(r, old, cur, named)
	var ce *ConflictError
	if errors.As(err, &ce) {
		ce.Current = ce.Current.Clone()
	}
	return err
}

// writeTemp writes data to a new temporary file in the directory and syncs
// it; it returns the file's path. The file is created with mode 0600.
func (s *FileStore) writeTemp(data []byte) (string, error) {
	f, err := s.createTemp()
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil {
		s.syncs.Add(1)
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = s.removeFile(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// syncDir makes the directory's entries (renames and removals) durable.
func (s *FileStore) syncDir() error {
	s.syncs.Add(1)
	return s.fs.SyncDir(s.dir)
}

// Get returns a copy of the record for key, an error matching ErrNotFound,
// or the *CorruptError of an unreadable record.
func (s *FileStore) Get(ctx context.Context, key string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: %s", ErrClosed, s.dir)
	}
	e := s.entries[stem(key)]
	if e == nil && !s.scanned {
		if err := s.complete(); err != nil {
			return nil, err
		}
		e = s.entries[stem(key)]
	}
	if e == nil {
		return nil, fmt.Errorf("%w: key %q in %s", ErrNotFound, key, s.dir)
	}
	s.read(e)
	if e.corrupt != nil {
		return nil, e.corrupt
	}
	return e.rec.Clone(), nil
}

// List returns copies of the records selected by f, oldest CreatedAt first
// and by Key among equals. It reads only the files that may hold a
// selected record: their names tell the key, whether the record is
// resolved and a hash of its Name.
//
// A file that cannot be read is reported if it may hold a selected record:
// the error joins a *CorruptError for each, in path order (CorruptErrors
// returns them all). So with f.Name set, a damaged file of another action
// is not reported and does not fail the call; a stray file, whose name
// spells no key, is reported only when f.Name is empty.
func (s *FileStore) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrClosed, s.dir)
	}
	if !f.Unresolved {
		if err := s.complete(); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	var out []*Record
	var corrupt []*CorruptError
	tag := filterTag(f)
	for _, e := range s.entries {
		if !e.mayHold(f, tag) {
			continue
		}
		s.read(e)
		switch {
		case e.corrupt != nil:
			corrupt = append(corrupt, e.corrupt)
		case f.match(e.rec):
			out = append(out, e.rec.Clone())
		}
	}
	s.mu.Unlock()
	sortRecords(out)
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

// Delete removes the record stored with old.Key if it is old's version,
// and syncs the directory. No record stored is not an error. A record
// that cannot be read is not deleted: Quarantine moves it aside.
func (s *FileStore) Delete(ctx context.Context, old *Record) error {
	if err := checkDelete(old); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.inflight.Done()
	s.mu.Lock()
	if err := s.complete(); err != nil {
		s.mu.Unlock()
		return err
	}
	id := stem(old.Key)
	e := s.entries[id]
	if e == nil {
		s.mu.Unlock()
		return nil
	}
	s.read(e)
	if e.corrupt != nil {
		s.mu.Unlock()
		return fmt.Errorf("persist: not deleting intent %q: its stored version is unreadable; Quarantine it: %w", old.Key, e.corrupt)
	}
	if err := deletable(old, e.rec); err != nil {
		s.mu.Unlock()
		return &ConflictError{Key: old.Key, Current: e.rec.Clone()}
	}
	err := s.remove(id, e)
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("persist: cannot delete intent %q (it is still stored): %w", old.Key, err)
	}
	if err := s.syncDir(); err != nil {
		return fmt.Errorf("persist: deleted intent %q in %s, but it may come back after a power loss (directory sync failed): %w", old.Key, s.dir, err)
	}
	return nil
}

// remove removes e's files, the older versions first, and forgets e. s.mu
// must be held.
func (s *FileStore) remove(id string, e *entry) error {
	for _, fl := range e.stale("") {
		if err := s.removeFile(filepath.Join(s.dir, fl.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	delete(s.entries, id)
	return nil
}

// Quarantine moves the damaged file at path, the Path of a *CorruptError
// this store reported, into the subdirectory "quarantine" of the store's
// directory, and returns its new path there. The store no longer reads it:
// the intent it held, if any, is gone from the store, or, if the damaged
// file was a newer version next to an older one, the older version is the
// record again. Nothing is deleted: inspect the quarantined file, reconcile
// the payment it may hold by hand, then remove it.
//
// Quarantine refuses a path that is not a damaged file the store knows of:
// a readable record is never moved aside. The move is durable when
// Quarantine returns. To quarantine every damaged file:
//
//	_, err := s.List(ctx, persist.Filter{})
//	for _, ce := range persist.CorruptErrors(err) {
//		if _, err := s.Quarantine(ctx, ce.Path); err != nil { ... }
//	}
func (s *FileStore) Quarantine(ctx context.Context, path string) (string, error) {
	if err := s.begin(ctx); err != nil {
		return "", err
	}
	defer s.inflight.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.complete(); err != nil {
		return "", err
	}
	var id string
	var e *entry
	for i, c := range s.entries {
		if c.corrupt != nil && c.corrupt.Path == path {
			id, e = i, c
			break
		}
	}
	if e == nil {
		return "", fmt.Errorf("persist: %s is not a damaged record file of the store in %s (List reports those); nothing was moved", path, s.dir)
	}
	name := e.files[0].name
	qdir := filepath.Join(s.dir, quarantineDir)
	if err := s.changeDir(func() error { return s.fs.Mkdir(qdir, 0o700) }); err == nil {
		if err := s.syncDir(); err != nil {
			return "", fmt.Errorf("persist: cannot create %s: %w", qdir, err)
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("persist: cannot create %s: %w", qdir, err)
	}
	dst, err := s.freeName(qdir, name)
	if err != nil {
		return "", err
	}
	if err := s.rename(path, dst); err != nil {
		return "", fmt.Errorf("persist: cannot move %s to %s (it is still in place): %w", path, dst, err)
	}
	// The new entry first: a power cut in between leaves the file in both
	// places, never in neither.
	s.syncs.Add(1)
	err = s.fs.SyncDir(qdir)
	if err == nil {
		err = s.syncDir()
	}
	e.files = e.files[1:]
	e.rec, e.corrupt = nil, nil
	if len(e.files) == 0 {
		delete(s.entries, id)
	} else if e.mayHold(Filter{Unresolved: true}, "") {
		s.read(e)
	}
	if err != nil {
		return dst, fmt.Errorf("persist: moved %s to %s, but the move may be undone by a power loss (directory sync failed): %w", path, dst, err)
	}
	return dst, nil
}

// freeName returns a path in dir for name that no file has: name, or name
// with a number appended.
func (s *FileStore) freeName(dir, name string) (string, error) {
	for i := 0; i < 1000; i++ {
		p := filepath.Join(dir, name)
		if i > 0 {
			p += "." + strconv.Itoa(i)
		}
		_, err := s.fs.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
		if err != nil {
			return "", fmt.Errorf("persist: cannot use %s: %w", dir, err)
		}
	}
	return "", fmt.Errorf("persist: %s holds 1,000 quarantined copies of %s; clear it", dir, name)
}

// Close waits for the saves and deletes in progress, writes the index if
// the store changed since it was last written (waiting once, 20 ms, if the
// directory changed within the clock's granularity; a failure costs the
// next OpenDir a scan, not an error), then releases the directory's lock.
// Methods called after Close return an error matching ErrClosed; closing
// again does nothing.
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
	if len(s.deferred) > 0 {
		// The last flush failed: one more try, and say so if it fails.
		s.flushing = true
		s.inflight.Add(1)
		s.mu.Unlock()
		s.flush()
		s.mu.Lock()
		if len(s.deferred) > 0 {
			flushErr = fmt.Errorf("persist: %d intents saved in %s may not survive a power loss (directory sync failed): %w", len(s.deferred), s.dir, s.flushErr)
		}
	}
	s.mu.Unlock()
	if errors.Is(s.writeIndex(), errRacyIndex) {
		// The directory changed within the clock's granularity: once
		// more after it.
		time.Sleep(racyWait)
		_ = s.writeIndex()
	}
	s.mu.Lock()
	s.entries = nil
	s.mu.Unlock()
	if err := s.lock.Close(); err != nil {
		return errors.Join(flushErr, fmt.Errorf("persist: cannot release the lock on %s: %w", s.dir, err))
	}
	return flushErr
}
