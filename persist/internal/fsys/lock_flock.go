//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package fsys

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// lockDir takes flock(2) on the directory itself, through a descriptor
// opened on it. Unlike a lock on a file inside the directory, it cannot be
// lost by someone removing that file while it is held: a second opener
// would create a new file and lock that one.
func lockDir(dir string) (io.Closer, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = d.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("flock %s: %w", dir, err)
	}
	return dirLock{d}, nil
}

type dirLock struct{ d *os.File }

// Close releases the lock and closes the descriptor. The lock is released
// explicitly first: a child process forked meanwhile may hold a copy of the
// descriptor until it execs, and closing ours alone would leave the lock
// held through that copy.
func (l dirLock) Close() error {
	err := syscall.Flock(int(l.d.Fd()), syscall.LOCK_UN)
	if cerr := l.d.Close(); err == nil {
		err = cerr
	}
	return err
}
