package persist_test

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/persist/internal/fsys"
)

// errPowerCut is returned by every call after a power cut, until Restart.
var errPowerCut = errors.New("strictfs: the power is off")

// strictFS is an in-memory file system that loses, at a simulated
// power cut, everything that was not synced, as Pebble's strict MemFS
// does: the data written to a file since its last Sync, and the entries
// created, renamed or removed in a directory since the directory's last
// sync. It is stricter still in two ways a real disk may be: the
// unsynced tail of a file may survive in part (a torn write), and a
// prefix of a directory's unsynced changes may survive, in the order they
// were made. A rename across directories survives in both or neither, as
// on a journaling file system, until one of them is synced; then the other
// half stands alone (the file may be found in both).
//
// A test sets a cut with CutAfter: the file system then applies that many
// more changes (creates, writes, syncs, renames, removals, locks) and
// fails the next one and every call after it with errPowerCut, as if the
// power had gone. Restart then brings back what survived and clears the
// locks, as a reboot does. Everything is deterministic given the seed of
// the random source Restart is handed.
//
// The zero value is not usable: call newStrictFS.
type strictFS struct {
	mu      sync.Mutex
	root    *inode
	cutIn   int  // changes left before the cut; <0: no cut set
	off     bool // the power is off
	changes int  // changes made since New
	seq     int  // for temporary names
	inos    uint64
	locks   map[*inode]*lock
}

// New returns an empty file system with a root directory "/".
func newStrictFS() *strictFS {
	f := &strictFS{cutIn: -1, locks: map[*inode]*lock{}}
	f.root = f.newDir()
	return f
}

// inode is a file or a directory.
type inode struct {
	dir bool
	// a file's data, and the prefix of it that is durable
	data   []byte
	synced int
	// a directory's entries, those that are durable, and the changes
	// since its last sync
	entries map[string]*inode
	durable map[string]*inode
	log     []*logged
	// ino is the inode's number; ctime the number of the change that
	// last changed its data or entries, and durCtime the one that did
	// before its last sync (what a power cut brings back).
	ino             uint64
	ctime, durCtime int64
}

// change is one atomic change of a directory's entries: set names to
// inodes, nil to remove.
type change map[string]*inode

// logged is a change in a directory's log. A rename across directories is
// one change in each directory's log, paired: a power cut keeps both or
// neither, until one directory is synced and the other's half stands
// alone.
type logged struct {
	c     change
	pair  *logged
	stamp int64 // the number of the change
}

func (f *strictFS) newDir() *inode {
	return f.stamped(&inode{dir: true, entries: map[string]*inode{}, durable: map[string]*inode{}})
}

// stamped gives n a number and the current change as its change time.
func (f *strictFS) stamped(n *inode) *inode {
	f.inos++
	n.ino = f.inos
	n.ctime, n.durCtime = int64(f.changes), int64(f.changes)
	return n
}

// CutAfter sets a power cut after n more changes: the n+1st fails, and
// every call after it, until Restart.
func (f *strictFS) CutAfter(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutIn = n
}

// Off reports whether the power is off.
func (f *strictFS) Off() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.off
}

// Changes returns how many changes the file system has applied since New.
func (f *strictFS) Changes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changes
}

// Restart ends a power cut (cutting the power first if it is on): every
// directory keeps its durable entries and, drawn from rng, a prefix of its
// later changes; every file keeps its durable data and, drawn from rng,
// maybe part of the rest. Locks are released.
func (f *strictFS) Restart(rng *rand.Rand) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dirs := f.dirs()
	keep := keptPrefixes(dirs, rng)
	for _, d := range dirs {
		for _, l := range d.log[:keep[d]] {
			apply(d.durable, l.c)
			d.durCtime = l.stamp
		}
		d.ctime = d.durCtime
		d.log = nil
		d.entries = maps.Clone(d.durable)
	}
	f.crashFiles(rng)
	f.off = false
	f.cutIn = -1
	f.locks = map[*inode]*lock{}
}

// dirs returns every directory that is or may come back, in a fixed
// order.
func (f *strictFS) dirs() []*inode {
	var dirs []*inode
	seen := map[*inode]bool{}
	var collect func(n *inode)
	collect = func(n *inode) {
		if seen[n] || !n.dir {
			return
		}
		seen[n] = true
		dirs = append(dirs, n)
		for _, m := range []map[string]*inode{n.entries, n.durable} {
			for _, name := range slices.Sorted(maps.Keys(m)) {
				collect(m[name])
			}
		}
		for _, l := range n.log {
			for _, name := range slices.Sorted(maps.Keys(l.c)) {
				if c := l.c[name]; c != nil {
					collect(c)
				}
			}
		}
	}
	collect(f.root)
	return dirs
}

// keptPrefixes draws how many of its unsynced changes each directory
// keeps: none, or a random prefix; a rename across directories is kept
// in both or neither.
func keptPrefixes(dirs []*inode, rng *rand.Rand) map[*inode]int {
	keep := map[*inode]int{}
	where := map[*logged]*inode{}
	index := map[*logged]int{}
	for _, d := range dirs {
		if len(d.log) > 0 && rng.IntN(2) == 0 {
			keep[d] = rng.IntN(len(d.log) + 1)
		}
		for i, l := range d.log {
			where[l], index[l] = d, i
		}
	}
	for changed := true; changed; {
		changed = false
		for _, d := range dirs {
			for i, l := range d.log[:keep[d]] {
				if l.pair == nil {
					continue
				}
				if pd := where[l.pair]; pd == nil || index[l.pair] >= keep[pd] {
					keep[d] = i
					changed = true
					break
				}
			}
		}
	}
	return keep
}

// crashFiles makes every file keep its durable data, and maybe part of
// the rest, drawn from rng.
func (f *strictFS) crashFiles(rng *rand.Rand) {
	done := map[*inode]bool{}
	var crash func(n *inode)
	crash = func(n *inode) {
		if done[n] {
			return
		}
		done[n] = true
		if !n.dir {
			if tail := len(n.data) - n.synced; tail > 0 && rng.IntN(2) == 0 {
				n.synced += rng.IntN(tail + 1)
			}
			if n.synced < len(n.data) || n.synced == 0 {
				// What was lost takes its change time with it.
				n.ctime = n.durCtime
			}
			n.data = n.data[:n.synced:n.synced]
			return
		}
		for _, name := range slices.Sorted(maps.Keys(n.entries)) {
			crash(n.entries[name])
		}
	}
	crash(f.root)
}

func apply(m map[string]*inode, c change) {
	for _, name := range slices.Sorted(maps.Keys(c)) {
		if n := c[name]; n != nil {
			m[name] = n
		} else {
			delete(m, name)
		}
	}
}

// change counts one change and reports errPowerCut if the power is off or
// goes now. f.mu must be held.
func (f *strictFS) change() error {
	if f.off {
		return errPowerCut
	}
	if f.cutIn == 0 {
		f.off = true
		return errPowerCut
	}
	if f.cutIn > 0 {
		f.cutIn--
	}
	f.changes++
	return nil
}

// read reports errPowerCut if the power is off. f.mu must be held.
func (f *strictFS) read() error {
	if f.off {
		return errPowerCut
	}
	return nil
}

// lookup returns the inode at p, an absolute path (with either separator,
// so that paths made with package filepath work on Windows too).
func (f *strictFS) lookup(op, p string) (*inode, error) {
	p = filepath.ToSlash(p)
	if !path.IsAbs(p) {
		return nil, &fs.PathError{Op: op, Path: p, Err: errors.New("strictfs: path is not absolute")}
	}
	n := f.root
	for _, name := range strings.Split(path.Clean(p), "/") {
		if name == "" {
			continue
		}
		if !n.dir {
			return nil, &fs.PathError{Op: op, Path: p, Err: errors.New("not a directory")}
		}
		next := n.entries[name]
		if next == nil {
			return nil, &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
		}
		n = next
	}
	return n, nil
}

// parent returns the directory that holds p, and p's name in it.
func (f *strictFS) parent(op, p string) (*inode, string, error) {
	p = path.Clean(filepath.ToSlash(p))
	d, err := f.lookup(op, path.Dir(p))
	if err != nil {
		return nil, "", err
	}
	if !d.dir {
		return nil, "", &fs.PathError{Op: op, Path: p, Err: errors.New("not a directory")}
	}
	return d, path.Base(p), nil
}

// set changes entries of directory d, and logs the change for a crash.
// f.mu must be held, and f.change have counted the change.
func (f *strictFS) set(d *inode, c change) *logged {
	apply(d.entries, c)
	d.ctime = int64(f.changes)
	l := &logged{c: c, stamp: d.ctime}
	d.log = append(d.log, l)
	return l
}

var _ fsys.FS = (*strictFS)(nil)

func (f *strictFS) Mkdir(p string, perm fs.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return err
	}
	d, name, err := f.parent("mkdir", p)
	if err != nil {
		return err
	}
	if d.entries[name] != nil {
		return &fs.PathError{Op: "mkdir", Path: p, Err: fs.ErrExist}
	}
	if err := f.change(); err != nil {
		return err
	}
	f.set(d, change{name: f.newDir()})
	return nil
}

func (f *strictFS) Stat(p string) (fs.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return nil, err
	}
	n, err := f.lookup("stat", p)
	if err != nil {
		return nil, err
	}
	return info{path.Base(p), n.dir, int64(len(n.data))}, nil
}

func (f *strictFS) ReadDir(p string) ([]fs.DirEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return nil, err
	}
	d, err := f.lookup("readdir", p)
	if err != nil {
		return nil, err
	}
	if !d.dir {
		return nil, &fs.PathError{Op: "readdir", Path: p, Err: errors.New("not a directory")}
	}
	var out []fs.DirEntry
	for _, name := range slices.Sorted(maps.Keys(d.entries)) {
		n := d.entries[name]
		out = append(out, fs.FileInfoToDirEntry(info{name, n.dir, int64(len(n.data))}))
	}
	return out, nil
}

func (f *strictFS) ReadFile(p string, limit int64) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return nil, err
	}
	n, err := f.lookup("open", p)
	if err != nil {
		return nil, err
	}
	if n.dir {
		return nil, &fs.PathError{Op: "read", Path: p, Err: errors.New("is a directory")}
	}
	if int64(len(n.data)) > limit {
		return nil, fmt.Errorf("%w: %d bytes, over the limit of %d", fsys.ErrTooLarge, len(n.data), limit)
	}
	return slices.Clone(n.data), nil
}

func (f *strictFS) CreateTemp(dir, pattern string) (fsys.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return nil, err
	}
	d, err := f.lookup("createtemp", dir)
	if err != nil {
		return nil, err
	}
	dir = filepath.ToSlash(dir)
	f.seq++
	name := pattern + strconv.Itoa(f.seq)
	if i := strings.LastIndex(pattern, "*"); i >= 0 {
		name = pattern[:i] + strconv.Itoa(f.seq) + pattern[i+1:]
	}
	if d.entries[name] != nil {
		return nil, &fs.PathError{Op: "createtemp", Path: path.Join(dir, name), Err: fs.ErrExist}
	}
	if err := f.change(); err != nil {
		return nil, err
	}
	n := f.stamped(&inode{})
	f.set(d, change{name: n})
	return &file{fs: f, n: n, name: path.Join(dir, name)}, nil
}

func (f *strictFS) Rename(oldpath, newpath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return err
	}
	od, oname, err := f.parent("rename", oldpath)
	if err != nil {
		return err
	}
	n := od.entries[oname]
	if n == nil {
		return &fs.PathError{Op: "rename", Path: oldpath, Err: fs.ErrNotExist}
	}
	nd, nname, err := f.parent("rename", newpath)
	if err != nil {
		return err
	}
	if old := nd.entries[nname]; old != nil && (old.dir != n.dir || old.dir && len(old.entries) > 0) {
		return &fs.PathError{Op: "rename", Path: newpath, Err: errors.New("destination exists and cannot be replaced")}
	}
	if err := f.change(); err != nil {
		return err
	}
	if od == nd {
		if oname != nname {
			f.set(od, change{oname: nil, nname: n})
		}
		return nil
	}
	// Across directories, one change in each, paired: a power cut keeps
	// both or neither, as a journaling file system does, until one of the
	// directories is synced.
	a := f.set(nd, change{nname: n})
	b := f.set(od, change{oname: nil})
	a.pair, b.pair = b, a
	return nil
}

func (f *strictFS) Remove(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return err
	}
	d, name, err := f.parent("remove", p)
	if err != nil {
		return err
	}
	n := d.entries[name]
	if n == nil {
		return &fs.PathError{Op: "remove", Path: p, Err: fs.ErrNotExist}
	}
	if n.dir && len(n.entries) > 0 {
		return &fs.PathError{Op: "remove", Path: p, Err: errors.New("directory not empty")}
	}
	if err := f.change(); err != nil {
		return err
	}
	f.set(d, change{name: nil})
	return nil
}

func (f *strictFS) SyncDir(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return err
	}
	d, err := f.lookup("sync", p)
	if err != nil {
		return err
	}
	if !d.dir {
		return &fs.PathError{Op: "sync", Path: p, Err: errors.New("not a directory")}
	}
	if err := f.change(); err != nil {
		return err
	}
	d.durable = maps.Clone(d.entries)
	d.durCtime = d.ctime
	for _, l := range d.log {
		if l.pair != nil {
			l.pair.pair = nil // the other half now stands alone
		}
	}
	d.log = nil
	return nil
}

// Stamp gives the number of the change that last changed p as its change
// and modification times: unlike a real clock's, no two changes share one.
func (f *strictFS) Stamp(p string) (fsys.Stamp, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return fsys.Stamp{}, err
	}
	n, err := f.lookup("stat", p)
	if err != nil {
		return fsys.Stamp{}, err
	}
	return n.stamp(), nil
}

func (f *strictFS) Stamps(dir string, names []string) ([]fsys.Stamp, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return nil, err
	}
	d, err := f.lookup("stat", dir)
	if err != nil {
		return nil, err
	}
	if !d.dir {
		return nil, &fs.PathError{Op: "stat", Path: dir, Err: errors.New("not a directory")}
	}
	out := make([]fsys.Stamp, len(names))
	for i, name := range names {
		if n := d.entries[name]; n != nil {
			out[i] = n.stamp()
		}
	}
	return out, nil
}

func (n *inode) stamp() fsys.Stamp {
	return fsys.Stamp{Ino: n.ino, Size: int64(len(n.data)), Mod: n.ctime, Change: n.ctime}
}

func (f *strictFS) Lock(p string) (io.Closer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.read(); err != nil {
		return nil, err
	}
	d, err := f.lookup("lock", p)
	if err != nil {
		return nil, err
	}
	if f.locks[d] != nil {
		return nil, fsys.ErrLocked
	}
	if err := f.change(); err != nil {
		return nil, err
	}
	l := &lock{fs: f, n: d}
	f.locks[d] = l
	return l, nil
}

type lock struct {
	fs *strictFS
	n  *inode
}

// Close releases the lock, unless a restart released it already.
func (l *lock) Close() error {
	l.fs.mu.Lock()
	defer l.fs.mu.Unlock()
	if l.fs.locks[l.n] == l {
		delete(l.fs.locks, l.n)
	}
	return nil
}

// file is a file created by CreateTemp.
type file struct {
	fs     *strictFS
	n      *inode
	name   string
	closed bool
}

func (fl *file) Name() string { return fl.name }

func (fl *file) Write(p []byte) (int, error) {
	f := fl.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl.closed {
		return 0, fs.ErrClosed
	}
	if err := f.change(); err != nil {
		return 0, err
	}
	fl.n.data = append(fl.n.data, p...)
	fl.n.ctime = int64(f.changes)
	return len(p), nil
}

func (fl *file) Sync() error {
	f := fl.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl.closed {
		return fs.ErrClosed
	}
	if err := f.change(); err != nil {
		return err
	}
	fl.n.synced = len(fl.n.data)
	fl.n.durCtime = fl.n.ctime
	return nil
}

// Close closes the file; it is not a change, and it does not fail after a
// power cut (there is nothing left to lose).
func (fl *file) Close() error {
	f := fl.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl.closed {
		return fs.ErrClosed
	}
	fl.closed = true
	return nil
}

// info describes an inode for Stat and ReadDir.
type info struct {
	name string
	dir  bool
	size int64
}

func (i info) Name() string { return i.name }
func (i info) Size() int64  { return i.size }
func (i info) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o700
	}
	return 0o600
}
func (i info) ModTime() time.Time { return time.Time{} }
func (i info) IsDir() bool        { return i.dir }
func (i info) Sys() any           { return nil }

// String describes the file system's current tree, for failure messages.
func (f *strictFS) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	var walk func(p string, n *inode)
	walk = func(p string, n *inode) {
		for _, name := range slices.Sorted(maps.Keys(n.entries)) {
			c := n.entries[name]
			if c.dir {
				fmt.Fprintf(&b, "%s/\n", path.Join(p, name))
				walk(path.Join(p, name), c)
			} else {
				fmt.Fprintf(&b, "%s (%d bytes, %d synced)\n", path.Join(p, name), len(c.data), c.synced)
			}
		}
	}
	walk("/", f.root)
	return b.String()
}
