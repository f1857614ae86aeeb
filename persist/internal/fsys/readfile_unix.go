//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package fsys

import (
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// ReadFile reads a regular file, never through a symbolic link. The
// open does not block: a FIFO put in a file's place would block it. The
// type is checked on the open file, so a swap after a check cannot pass.
// The read stops at the size the open file had. So a device, or a file
// that grows, costs no more than its size then. That size is checked
// against limit first.
func (OS) ReadFile(path string, limit int64) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w (%v)", ErrNotRegular, fi.Mode().Type())
	}
	if fi.Size() > limit {
		return nil, tooLarge(fi.Size(), limit)
	}
	data := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return data, nil
}
