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

// entry is what the store knows of one record file: the record, or why it
// cannot be read.
type entry struct {
	rec     *Record
	corrupt *CorruptError
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

// load reads every record file in the directory, and removes the temporary
// files a crash left: they were never renamed, so they were never a saved
// record, and no other store can be writing them while we hold the lock.
func (s *FileStore) load() error {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("persist: cannot read store directory %s: %w", s.dir, err)
	}
	s.files = make(map[string]*entry, len(des))
	for _, de := range des {
		name := de.Name()
		switch {
		case strings.HasPrefix(name, tempPrefix):
			_ = os.Remove(filepath.Join(s.dir, name))
		case isRecordName(name):
			s.files[name] = s.readEntry(name, de.Type())
		}
	}
	return nil
}

// readEntry reads the record file name.
func (s *FileStore) readEntry(name string, typ fs.FileMode) *entry {
	path := filepath.Join(s.dir, name)
	var rec *Record
	var err error
	if !typ.IsRegular() {
		err = fmt.Errorf("not a regular file (%v)", typ)
	} else {
		var data []byte
		if data, err = os.ReadFile(path); err == nil {
			rec, err = decodeFile(name, data)
		}
	}
	if err != nil {
		return &entry{corrupt: &CorruptError{Path: path, Key: keyFromName(name), Err: err}}
	}
	return &entry{rec: rec}
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

	name := fileName(r.Key)
	path := filepath.Join(s.dir, name)
	if err := s.checkReplaceable(name); err != nil {
		return err
	}
	tmp, err := s.writeTemp(data)
	if err != nil {
		return fmt.Errorf("persist: cannot save intent %q in %s (check free space and permissions; the previous version is intact): %w", r.Key, s.dir, err)
	}

	s.mu.Lock()
	if err := s.checkReplaceableLocked(name); err != nil {
		s.mu.Unlock()
		_ = os.Remove(tmp)
		return err
	}
	// The rename and the cache update happen under one lock, so that of two
	// concurrent saves of one key the one renamed last is the one cached.
	if err := os.Rename(tmp, path); err != nil {
		s.mu.Unlock()
		_ = os.Remove(tmp)
		return fmt.Errorf("persist: cannot save intent %q to %s (the previous version is intact): %w", r.Key, path, err)
	}
	s.files[name] = &entry{rec: r}
	s.mu.Unlock()

	// Any sync of the directory after the rename makes it durable, so
	// concurrent saves may sync in parallel.
	if err := s.syncDir(); err != nil {
		return fmt.Errorf("persist: intent %q was written to %s but may not survive a power loss (directory sync failed; do not send it yet, save again): %w", r.Key, path, err)
	}
	return nil
}

func (s *FileStore) checkReplaceable(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkReplaceableLocked(name)
}

func (s *FileStore) checkReplaceableLocked(name string) error {
	if e := s.files[name]; e != nil && e.corrupt != nil {
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
	e := s.files[fileName(key)]
	switch {
	case e == nil:
		return nil, fmt.Errorf("%w: key %q in %s", ErrNotFound, key, s.dir)
	case e.corrupt != nil:
		return nil, e.corrupt
	}
	return e.rec.Clone(), nil
}

// List returns copies of the records selected by f, oldest CreatedAt first
// and by Key among equals, and the *CorruptError of every unreadable record
// (whatever f), joined.
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
	name := fileName(key)
	path := filepath.Join(s.dir, name)
	s.mu.Lock()
	err := os.Remove(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.mu.Unlock()
		return fmt.Errorf("persist: cannot delete intent %q at %s (it is still stored): %w", key, path, err)
	}
	delete(s.files, name)
	s.mu.Unlock()
	if err != nil { // it was not there
		return nil
	}
	if err := s.syncDir(); err != nil {
		return fmt.Errorf("persist: deleted intent %q at %s, but it may come back after a power loss (directory sync failed): %w", key, path, err)
	}
	return nil
}

// Prune implements Pruner: see the function Prune. It removes the files
// under the store's lock and syncs the directory once.
func (s *FileStore) Prune(ctx context.Context, before time.Time) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	defer s.inflight.Done()
	var errs []error
	var corrupt []*CorruptError
	n := 0
	s.mu.Lock()
	for name, e := range s.files {
		if e.corrupt != nil {
			corrupt = append(corrupt, e.corrupt)
			continue
		}
		if !prunable(e.rec, before) {
			continue
		}
		path := filepath.Join(s.dir, name)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("persist: cannot prune intent %q at %s: %w", e.rec.Key, path, err))
			continue
		}
		delete(s.files, name)
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
	s.files = nil
	s.mu.Unlock()
	s.inflight.Wait()
	if err := s.lock.Unlock(); err != nil {
		return fmt.Errorf("persist: cannot release the lock on %s: %w", s.dir, err)
	}
	return nil
}
