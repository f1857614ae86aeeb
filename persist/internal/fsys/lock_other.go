//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package fsys

import (
	"io"
	"path/filepath"

	"github.com/gofrs/flock"
)

// LockName is the file lockDir locks where a directory cannot be locked
// itself. On Windows the holder keeps it open without FILE_SHARE_DELETE, so
// it cannot be removed or renamed while the lock is held.
const LockName = "LOCK"

// lockDir locks the file LOCK in dir (LockFileEx on Windows, fcntl on AIX
// and Solaris, through github.com/gofrs/flock).
func lockDir(dir string) (io.Closer, error) {
	lk := flock.New(filepath.Join(dir, LockName), flock.SetPermissions(0o600))
	ok, err := lk.TryLock()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrLocked
	}
	return fileLock{lk}, nil
}

type fileLock struct{ lk *flock.Flock }

func (l fileLock) Close() error { return l.lk.Unlock() }
