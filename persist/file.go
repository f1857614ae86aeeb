package persist

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"
)

// FileStore is the default Store: one file per intent in a directory of its
// own, each Save made durable before it returns. See the package docs for the
// layout, the durability scheme and the locking.
//
// A FileStore holds an exclusive lock on its directory from OpenDir to
// Close, and keeps the records it read at OpenDir in memory, so Get and List
// do not touch the disk. A FileStore is safe for concurrent use by multiple
// goroutines.
type FileStore struct {
	dir  string
	opts Options
	lock *flock.Flock

	// syncs counts fsync calls, for the benchmarks.
	syncs atomic.Int64

	mu       sync.Mutex
	closed   bool
	files    map[string]*entry // by file name
	inflight sync.WaitGroup    // methods that write, waited for by Close
}

// entry is what the store knows of one intent's files: the record, or why it
// cannot be read, or (for a resolved record not asked for yet) neither.
type entry struct {
	stem     string
	resolved bool // the record is in stem+resolvedSuffix, else stem+openSuffix
	// twin: the file with the other suffix exists too, left by a save that
	// moved the record between them and was cut short. The resolved file
	// is the record; the unresolved twin is removed on the next write.
	twin    bool
	rec     *Record // nil until read, or if unreadable
	corrupt *CorruptError
}

func (e *entry) name() string {
	if e.resolved {
		return e.stem + resolvedSuffix
	}
	return e.stem + openSuffix
}

func (e *entry) twinName() string {
	if e.resolved {
		return e.stem + openSuffix
	}
	return e.stem + resolvedSuffix
}

// OpenDir opens the store in dir, creating dir with mode 0700 if it does not
// exist, and reads every record in it. opts may be nil.
//
// OpenDir returns an error matching ErrLocked if another store, in this or
// another process, has dir open; one matching ErrInsecureDir if dir exists
// and its mode gives group or others any access (on Unix systems); and an
// error if dir cannot be created, locked or read. A record that cannot be
// read is not an error of OpenDir: List and Get report it.
func OpenDir(dir string, opts *Options) (*FileStore, error) {
	if dir == "" {
		return nil, errors.New("persist: no store directory given")
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("persist: cannot create store directory %s: %w", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("persist: cannot open store directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("persist: store directory %s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" && runtime.GOOS != "plan9" {
		return nil, fmt.Errorf("%w: %s has mode %04o; run chmod 0700 on it or use a new directory", ErrInsecureDir, dir, perm)
	}

	lockPath := filepath.Join(dir, lockName)
	lk := flock.New(lockPath, flock.SetPermissions(0o600))
	ok, err := lk.TryLock()
	if err != nil {
		return nil, fmt.Errorf("persist: cannot lock store directory %s through %s: %w", dir, lockPath, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s is open elsewhere (lock file %s); close the other store first or use another directory", ErrLocked, dir, lockPath)
	}

	s := &FileStore{dir: dir, lock: lk}
	if opts != nil {
		s.opts = *opts
	}
	if err := s.load(); err != nil {
		_ = lk.Unlock()
		return nil, err
	}
	return s, nil
}

// load reads the directory, and the file of every unresolved record; the
// files of resolved records are read when asked for. It removes the
// temporary files a crash left: they were never renamed, so they were never
// a saved record, and no other store can be writing them while we hold the
// lock.
func (s *FileStore) load() error {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("persist: cannot read store directory %s: %w", s.dir, err)
	}
	s.files = make(map[string]*entry, len(des))
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, tempPrefix) {
			_ = os.Remove(filepath.Join(s.dir, name))
			continue
		}
		st, resolved, ok := parseName(name)
		if !ok {
			continue
		}
		e := s.files[st]
		if e == nil {
			e = &entry{stem: st, resolved: resolved}
			s.files[st] = e
		} else {
			e.twin = true
			e.resolved = true
		}
		if !de.Type().IsRegular() {
			e.corrupt = s.corruptError(e, name, fmt.Errorf("not a regular file (%v)", de.Type()))
		}
	}
	for _, e := range s.files {
		if !e.resolved {
			s.read(e)
		}
	}
	return nil
}

// read reads e's record from its file, once.
func (s *FileStore) read(e *entry) {
	if e.rec != nil || e.corrupt != nil {
		return
	}
	name := e.name()
	data, err := os.ReadFile(filepath.Join(s.dir, name))
	if err == nil {
		e.rec, err = decodeFile(name, data)
	}
	if err != nil {
		e.corrupt = s.corruptError(e, name, err)
	}
}

func (s *FileStore) corruptError(e *entry, name string, err error) *CorruptError {
	return &CorruptError{Path: filepath.Join(s.dir, name), Key: keyFromStem(e.stem), Err: err}
}

// Dir returns the store's directory, as an absolute path.
func (s *FileStore) Dir() string { return s.dir }

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

// Save writes rec durably, replacing any record with the same Key: it
// writes a temporary file, syncs it, renames it over the record's file and
// syncs the directory. When Save returns an error, the record's file is the
// previous version (or absent), except when only the final sync of the
// directory failed: then it is the new version, complete, but perhaps not
// yet safe from power loss, and the error says so.
//
// When a record becomes resolved its file is renamed to the resolved
// suffix: the new file is synced in, then the old one removed, at no extra
// sync. A record that goes back from resolved to unresolved (which idem's
// client never does) costs a third sync.
//
// Save refuses to replace a record that cannot be read (see CorruptError):
// Delete it first.
func (s *FileStore) Save(ctx context.Context, rec *Record) error {
	r, err := prepare(rec, s.opts)
	if err != nil {
		return err
	}
	data, err := encodeRecord(r)
	if err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.inflight.Done()

	// Checked before writing; only Delete and Save change an entry, and
	// neither makes it unreadable.
	st := stem(r.Key)
	s.mu.Lock()
	err = s.checkReplaceable(st)
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
	ne := &entry{stem: st, resolved: r.State.Resolved(), rec: r}
	path := filepath.Join(s.dir, ne.name())
	// The rename and the cache update happen under one lock, so that of two
	// concurrent saves of one key the one renamed last is the one cached.
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("persist: cannot save intent %q to %s (the previous version is intact): %w", r.Key, path, err)
	}
	old := s.files[st]
	s.files[st] = ne
	if old == nil || (old.resolved == ne.resolved && !old.twin) {
		// The common case. Any sync of the directory after the rename
		// makes it durable, so concurrent saves sync in parallel.
		s.mu.Unlock()
		locked = false
		if err := s.syncDir(); err != nil {
			return syncFailed(r.Key, path, err)
		}
		return nil
	}

	// The record moves between suffixes: sync the new file in before the
	// old one goes, so that a crash leaves one or both, never neither. All
	// under the lock, so no other save of the key runs in between.
	if err := s.syncDir(); err != nil {
		return syncFailed(r.Key, path, err)
	}
	twin := filepath.Join(s.dir, ne.twinName())
	if err := os.Remove(twin); err != nil && !errors.Is(err, fs.ErrNotExist) {
		ne.twin = true
		if ne.resolved {
			return nil // the resolved file wins over its twin at OpenDir
		}
		return fmt.Errorf("persist: intent %q was saved to %s, but its old resolved version %s cannot be removed and would take its place after a restart; remove that file: %w", r.Key, path, twin, err)
	}
	if !ne.resolved {
		// A resolved twin that came back after a power loss would win.
		if err := s.syncDir(); err != nil {
			return syncFailed(r.Key, path, err)
		}
	}
	return nil
}

func syncFailed(key, path string, err error) error {
	return fmt.Errorf("persist: intent %q was written to %s but may not survive a power loss (directory sync failed; do not send it yet, save again): %w", key, path, err)
}

// checkReplaceable returns an error if the record stored under st cannot
// be read. s.mu must be held.
func (s *FileStore) checkReplaceable(st string) error {
	e := s.files[st]
	if e == nil {
		return nil
	}
	s.read(e)
	if e.corrupt != nil {
		return fmt.Errorf("persist: not replacing intent %q: its stored version is unreadable; Delete it first to replace it: %w", e.corrupt.Key, e.corrupt)
	}
	return nil
}

// writeTemp writes data to a new temporary file in the directory and syncs
// it; it returns the file's path. The file is created with mode 0600.
func (s *FileStore) writeTemp(data []byte) (string, error) {
	f, err := os.CreateTemp(s.dir, tempPrefix+"*")
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
		_ = os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// syncDir makes the directory's entries (renames and removals) durable.
func (s *FileStore) syncDir() error {
	s.syncs.Add(1)
	return syncDir(s.dir)
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
	e := s.files[stem(key)]
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
// and by Key among equals, and the *CorruptError of every unreadable record
// it knows of, whatever f, joined. With f.Unresolved, List does not read the
// files of resolved records, so it reports only the unreadable files of
// unresolved records and of those read before.
func (s *FileStore) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrClosed, s.dir)
	}
	var out []*Record
	var corrupt []*CorruptError
	for _, e := range s.files {
		if f.Unresolved && e.resolved && e.corrupt == nil {
			continue
		}
		s.read(e)
		switch {
		case e.corrupt != nil:
			corrupt = append(corrupt, e.corrupt)
		case f.Match(e.rec):
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

// Delete removes the record for key, readable or not, and syncs the
// directory. Deleting an absent key is not an error.
func (s *FileStore) Delete(ctx context.Context, key string) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.inflight.Done()
	s.mu.Lock()
	e := s.files[stem(key)]
	if e == nil {
		s.mu.Unlock()
		return nil
	}
	err := s.remove(e)
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("persist: cannot delete intent %q (it is still stored): %w", key, err)
	}
	if err := s.syncDir(); err != nil {
		return fmt.Errorf("persist: deleted intent %q in %s, but it may come back after a power loss (directory sync failed): %w", key, s.dir, err)
	}
	return nil
}

// remove removes e's files, its twin first, and forgets e. s.mu must be
// held.
func (s *FileStore) remove(e *entry) error {
	for _, name := range []string{e.twinName(), e.name()} {
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	delete(s.files, e.stem)
	return nil
}

// Prune implements Pruner: see the function Prune. It reads the files of
// resolved records it has not read yet, removes the files under the store's
// lock and syncs the directory once.
func (s *FileStore) Prune(ctx context.Context, before time.Time) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	defer s.inflight.Done()
	var errs []error
	var corrupt []*CorruptError
	n := 0
	s.mu.Lock()
	for _, e := range s.files {
		if !e.resolved && e.corrupt == nil {
			continue // unresolved: never pruned
		}
		s.read(e)
		if e.corrupt != nil {
			corrupt = append(corrupt, e.corrupt)
			continue
		}
		if !prunable(e.rec, before) {
			continue
		}
		if err := s.remove(e); err != nil {
			errs = append(errs, fmt.Errorf("persist: cannot prune intent %q: %w", e.rec.Key, err))
			continue
		}
		n++
	}
	s.mu.Unlock()
	if n > 0 {
		if err := s.syncDir(); err != nil {
			errs = append(errs, fmt.Errorf("persist: pruned %d intents in %s, but they may come back after a power loss (directory sync failed): %w", n, s.dir, err))
		}
	}
	return n, errors.Join(append(errs, joinCorrupt(corrupt))...)
}

// Close waits for the saves and deletes in progress, then releases the
// directory's lock. Methods called after Close return an error matching
// ErrClosed; closing again does nothing.
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
	s.files = nil
	s.mu.Unlock()
	if err := s.lock.Unlock(); err != nil {
		return fmt.Errorf("persist: cannot release the lock on %s: %w", s.dir, err)
	}
	return nil
}
