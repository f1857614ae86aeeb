//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package fsys

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// LockName is the file in the directory that lockDir locks besides the
// directory itself: the lock an earlier build of the store took, with
// flock(2) through github.com/gofrs/flock, before the directory itself was
// locked. Taking both keeps a process of that build and one of this build
// from opening one directory at once. This rule stays: it is how builds
// that lock differently exclude each other, not code to read an old
// format.
const LockName = "LOCK"

// lockDir takes flock(2) on the directory itself, through a descriptor
// opened on it, and then on the file LockName in it. The lock on the
// directory cannot be lost by someone removing LockName while it is held:
// a second opener would create a new file and lock that one, but not the
// directory.
func lockDir(dir string) (io.Closer, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := flock(d); err != nil {
		_ = d.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("flock %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err == nil {
		if err = flock(f); err != nil {
			_ = f.Close()
		}
	}
	if err != nil {
		_ = dirLock{d: d}.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked (by an earlier build of the store, or another program)", ErrLocked, path)
		}
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return dirLock{d: d, f: f}, nil
}

// flock takes an exclusive flock(2) on f without waiting.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// dirLock holds the directory's lock, d, and LockName's, f (nil while
// only the directory is locked).
type dirLock struct{ d, f *os.File }

// Close releases the locks and closes the descriptors, LockName's first.
// Each lock is released explicitly before its descriptor is closed: a
// child process forked meanwhile may hold a copy of the descriptor until it
// execs, and closing ours alone would leave the lock held through that
// copy.
func (l dirLock) Close() error {
	var errs []error
	for _, f := range []*os.File{l.f, l.d} {
		if f == nil {
			continue
		}
		errs = append(errs, syscall.Flock(int(f.Fd()), syscall.LOCK_UN), f.Close())
	}
	return errors.Join(errs...)
}
