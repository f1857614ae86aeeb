// Package fsys is the file system a persist.FileStore works through: the
// operating system's in production, and in tests a file system that
// forgets, at a power cut, every write that was not synced (strictFS,
// in persist's tests), so that the store's ordering of fsync, rename and directory
// sync is tested rather than assumed.
package fsys

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// ErrLocked is returned by FS.Lock when another holder has the directory
// locked.
var ErrLocked = errors.New("directory is locked by another holder")

// ErrNotRegular is returned by FS.ReadFile for a path that is not a
// regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is matched by the error of FS.ReadFile for a file larger
// than its limit. A damaged or hostile file may report any size, a sparse
// one with no disk spent. So its size is checked before anything is
// allocated for it.
var ErrTooLarge = errors.New("file too large")

// tooLarge returns the error of ReadFile for a file of size bytes, over
// limit.
func tooLarge(size, limit int64) error {
	return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrTooLarge, size, limit)
}

// FS is the part of a file system a FileStore uses. Paths are absolute.
type FS interface {
	// Mkdir creates the directory path; its entry in the parent is durable
	// only once the parent is synced.
	Mkdir(path string, perm fs.FileMode) error
	Stat(path string) (fs.FileInfo, error)
	// ReadDir returns the entries of dir in no set order. Sorting 10,000
	// names cost an open from the index a tenth of its time.
	ReadDir(dir string) ([]fs.DirEntry, error)
	// ReadFile reads a regular file, not through a link. Any other
	// type gives an error matching ErrNotRegular, at once. A file of
	// more than limit bytes gives an error matching ErrTooLarge, which
	// names its size, before anything is allocated for it.
	ReadFile(path string, limit int64) ([]byte, error)
	// CreateTemp creates a new file in dir, with mode 0600, whose name is
	// pattern with its last "*" replaced by a random string.
	CreateTemp(dir, pattern string) (File, error)
	// Rename replaces newpath by oldpath atomically; the change is durable
	// once the directories involved are synced.
	Rename(oldpath, newpath string) error
	// Remove removes a file or an empty directory; durable once the parent
	// is synced.
	Remove(path string) error
	// SyncDir makes the entries of dir (creations, renames, removals)
	// durable.
	SyncDir(dir string) error
	// Lock takes an exclusive lock on dir, held until the returned Closer
	// is closed or the process ends; it returns an error matching ErrLocked
	// at once if another holder, in this process or another, has it. The
	// lock cannot be lost while held: removing a file of the directory does
	// not release it.
	Lock(dir string) (io.Closer, error)
	// Stamp returns the stamp of path, a file or a directory.
	Stamp(path string) (Stamp, error)
	// Stamps returns the stamps of the named entries of dir, the zero
	// Stamp for a name that does not exist.
	Stamps(dir string, names []string) ([]Stamp, error)
}

// Stamp tells whether a file or a directory changed: any write to a file,
// and any creation, rename or removal of a directory's entries, changes its
// Change time (its ctime where the system has one, which no one can set
// back at will, else its modification time). Times are from the system's
// clock at the file system's granularity, so two changes may share one.
type Stamp struct {
	Ino    uint64 // the file's inode number, 0 where unknown
	Size   int64
	Mod    int64 // modification time, in nanoseconds since the epoch
	Change int64 // change time, in nanoseconds since the epoch
}

// File is a file being written.
type File interface {
	Name() string
	Write(p []byte) (int, error)
	// Sync makes the data written so far durable.
	Sync() error
	Close() error
}

// OS is the operating system's file system.
type OS struct{}

func (OS) Mkdir(path string, perm fs.FileMode) error { return os.Mkdir(path, perm) }
func (OS) Stat(path string) (fs.FileInfo, error)     { return os.Stat(path) }
func (OS) Rename(oldpath, newpath string) error      { return os.Rename(oldpath, newpath) }
func (OS) Remove(path string) error                  { return os.Remove(path) }
func (OS) SyncDir(dir string) error                  { return syncDir(dir) }
func (OS) Lock(dir string) (io.Closer, error)        { return lockDir(dir) }

func (OS) ReadDir(dir string) ([]fs.DirEntry, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
}

func (OS) CreateTemp(dir, pattern string) (File, error) {
	// os.CreateTemp creates the file with mode 0600.
	return os.CreateTemp(dir, pattern)
}
