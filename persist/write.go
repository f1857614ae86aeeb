package persist

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"sync/atomic"
)

// Write writes rec durably if the stored records allow it (see Store).
// It writes a temporary file and syncs it. It renames it over the
// record's file, and syncs the directory. The check is made before the
// temporary file is written. It is made again after, in one step with
// the rename. So of two writes racing for one version, one wins. So does
// one of two racing for one action's next Seq. When Write returns an
// error, the record's file is the previous version, or absent. The one
// exception is a failure of the final sync of the directory. Then the
// file is the new version, complete, but perhaps not yet safe from power
// loss. The error says so.
//
// ctx may be made by WithDeferredSync, and rec replace a stored version.
// Then Write returns before the directory is synced. The sync happens in
// the background, and Close waits for it. Until then, a power loss may
// undo the rename. The key then holds its previous version, whole. The
// new file is never seen damaged, as it is synced before the rename.
//
// Write refuses to replace a record that cannot be read (see
// CorruptError). Quarantine it first. It refuses a record whose file
// would be over 256 MiB, the most a record file may hold, and stores
// nothing.
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

	// Checked before writing, to spare the write when it would lose.
	s.mu.Lock()
	err = s.complete()
	if err == nil {
		err = s.writableLocked(r, old)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	tmp, err := s.writeTemp(data, &s.syncs)
	if err != nil {
		return fmt.Errorf("persist: cannot save intent %q in %s (check free space and permissions; the previous version is intact): %w", r.Key, s.dir, err)
	}

	s.mu.Lock()
	prev, err := s.install(r, old, tmp)
	switch {
	case err != nil:
		s.mu.Unlock()
		return err
	case prev != nil && DeferredSync(ctx):
		// A power loss before the sync leaves the previous version.
		s.deferred++
		if !s.flushing {
			s.flushing = true
			s.inflight.Add(1) // this save's own count keeps Close waiting
			go s.flush()
		}
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	// Any sync of the directory that starts after the rename makes it
	// durable. So concurrent saves share one.
	if err := s.dirSync.sync(s.syncDir); err != nil {
		return fmt.Errorf("persist: intent %q was written to %s but may not survive a power loss (directory sync failed; do not send it yet, save again): %w", r.Key, filepath.Join(s.dir, fileName(r.Key, r.Name)), err)
	}
	return nil
}

// install renames tmp, which holds r, over r's file if the stored
// records still allow it. It makes the file r's entry. It returns the
// entry it replaced, nil if none. s.mu must be held.
func (s *FileStore) install(r, old *Record, tmp string) (prev *entry, err error) {
	// Checked again, in one step with the rename and the update of the
	// entries. Another write may have won since.
	if err := s.writableLocked(r, old); err != nil {
		_ = s.fs.Remove(tmp)
		return nil, err
	}
	if err := s.change(); err != nil {
		_ = s.fs.Remove(tmp)
		return nil, err
	}
	name := fileName(r.Key, r.Name)
	path := filepath.Join(s.dir, name)
	if err := s.fs.Rename(tmp, path); err != nil {
		_ = s.fs.Remove(tmp)
		return nil, fmt.Errorf("persist: cannot save intent %q to %s (the previous version is intact): %w", r.Key, path, err)
	}
	ne := &entry{name: name, resolved: r.State.Resolved()}
	ne.p, _ = parseName(name)
	if !ne.resolved {
		ne.rec = r
		ne.st, _ = s.fs.Stamp(path) // for the index; zero if it fails
	}
	id := stem(r.Key)
	prev = s.entries[id]
	s.entries[id] = ne
	return prev, nil
}

// flush syncs the directory for the deferred saves until none is left.
// Then it writes the index. So an app killed after an intent resolved
// opens from it. flush runs in its own goroutine, counted in s.inflight.
// If the sync fails, the saves stay deferred. The next deferred write or
// Close tries again.
func (s *FileStore) flush() {
	defer s.inflight.Done()
	indexed := false
	for {
		s.mu.Lock()
		n := s.deferred
		s.deferred = 0
		if n == 0 && indexed {
			s.flushing = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if n == 0 {
			indexed = true
			_ = s.writeIndex()
			continue
		}
		indexed = false
		// Shared with the saves syncing the directory at the same time.
		err := s.dirSync.sync(s.syncDir)
		s.mu.Lock()
		if err != nil {
			s.deferred += n
			s.flushErr = err
			s.flushing = false
			s.mu.Unlock()
			return
		}
		s.flushErr = nil
		s.mu.Unlock()
	}
}

// writableLocked returns nil if r may be written over old (see
// writable). It judges by the record stored with r.Key. For a new intent
// of a Name, it judges by every record of that Name too. A record it
// needs may be unreadable. Its *CorruptError then refuses the write. s.mu
// must be held, and entries complete.
func (s *FileStore) writableLocked(r, old *Record) error {
	var cur *Record
	if e := s.entries[stem(r.Key)]; e != nil {
		rec, ce := s.record(e)
		if ce != nil {
			return fmt.Errorf("persist: not replacing intent %q: its stored version is unreadable; Quarantine it first to replace it: %w", r.Key, ce)
		}
		cur = rec
	}
	var named []*Record
	if old == nil && r.Name != "" {
		var err error
		// An unreadable record may be the action's latest.
		if named, err = s.selectLocked(Filter{Name: r.Name}, s.record); err != nil {
			return err
		}
	}
	return writable(r, old, cur, named)
}

// writeTemp writes data to a new temporary file in the directory. It
// syncs the file, counted in syncs, and returns its path. The file is
// created with mode 0600.
func (s *FileStore) writeTemp(data []byte, syncs *atomic.Int64) (string, error) {
	f, err := s.fs.CreateTemp(s.dir, tempPrefix+"*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil {
		syncs.Add(1)
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = s.fs.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// Delete removes the record stored with old.Key if it is old's version.
// Then it syncs the directory. No record stored is not an error. A record
// that cannot be read is not deleted. Quarantine moves it aside.
func (s *FileStore) Delete(ctx context.Context, old *Record) error {
	if err := checkDelete(old); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.inflight.Done()
	s.mu.Lock()
	removed, err := s.deleteLocked(old)
	s.mu.Unlock()
	if err != nil || !removed {
		return err
	}
	if err := s.syncDir(); err != nil {
		return fmt.Errorf("persist: deleted intent %q in %s, but it may come back after a power loss (directory sync failed): %w", old.Key, s.dir, err)
	}
	return nil
}

// deleteLocked removes old's record if it is still that version. It
// reports whether it removed a file. s.mu must be held.
func (s *FileStore) deleteLocked(old *Record) (bool, error) {
	if err := s.complete(); err != nil {
		return false, err
	}
	id := stem(old.Key)
	e := s.entries[id]
	if e == nil {
		return false, nil
	}
	cur, ce := s.record(e)
	if ce != nil {
		return false, fmt.Errorf("persist: not deleting intent %q: its stored version is unreadable; Quarantine it: %w", old.Key, ce)
	}
	if err := deletable(old, cur); err != nil {
		return false, err
	}
	if err := s.change(); err != nil {
		return false, err
	}
	if err := s.fs.Remove(filepath.Join(s.dir, e.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("persist: cannot delete intent %q (it is still stored): %w", old.Key, err)
	}
	delete(s.entries, id)
	return true, nil
}

// Quarantine moves the damaged file at path aside. path is the Path of a
// *CorruptError this store reported. The file goes into the subdirectory
// "quarantine" of the store's directory. Quarantine returns its new path
// there. The store no longer reads it. The intent it held, if any, is
// gone from the store. Nothing is deleted. Inspect the quarantined file,
// and reconcile by hand the payment it may hold. Then remove it.
//
// Quarantine refuses a path that is not a damaged file the store knows
// of. A readable record is never moved aside. The move is durable when
// Quarantine returns. Two files of one key are both damage. Quarantine
// the one that is not the intent: read both first. The other is then the
// key's record, no longer damage. To quarantine every damaged file:
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
		if filepath.Join(s.dir, c.name) != path {
			continue
		}
		// A file of a key with two is damage even before it is read.
		if _, ce := s.record(c); ce != nil {
			id, e = i, c
		}
		break
	}
	if e == nil {
		return "", fmt.Errorf("persist: %s is not a damaged record file of the store in %s (List reports those); nothing was moved", path, s.dir)
	}
	qdir := filepath.Join(s.dir, quarantineDir)
	if err := mkdirAll(s.fs, qdir); err != nil {
		return "", fmt.Errorf("persist: cannot create %s: %w", qdir, err)
	}
	dst, err := s.freeName(qdir, e.name)
	if err != nil {
		return "", err
	}
	if err := s.change(); err != nil {
		return "", err
	}
	if err := s.fs.Rename(path, dst); err != nil {
		return "", fmt.Errorf("persist: cannot move %s to %s (it is still in place): %w", path, dst, err)
	}
	// The new entry first. A power cut in between leaves the file in both
	// places, never in neither.
	s.syncs.Add(1)
	err = s.fs.SyncDir(qdir)
	if err == nil {
		err = s.syncDir()
	}
	delete(s.entries, id)
	if e.twin {
		s.untwin(e.p.id)
	}
	if err != nil {
		return dst, fmt.Errorf("persist: moved %s to %s, but the move may be undone by a power loss (directory sync failed): %w", path, dst, err)
	}
	return dst, nil
}

// untwin makes the last file left of key id, once a second file is
// gone, the key's entry. It is read again as any file is. s.mu must be
// held.
func (s *FileStore) untwin(id string) {
	var left []string
	for i, c := range s.entries {
		if c.twin && c.p.id == id {
			left = append(left, i)
		}
	}
	if len(left) != 1 {
		return
	}
	c := s.entries[left[0]]
	delete(s.entries, left[0])
	e := &entry{name: c.name, p: c.p, mode: c.mode}
	s.entries[id] = e
	s.record(e)
}

// freeName returns a path in dir for name that no file has. That is
// name, or name with a number appended.
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
