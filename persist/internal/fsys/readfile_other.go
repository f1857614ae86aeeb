//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package fsys

import (
	"fmt"
	"io"
	"os"
)

// ReadFile reads a regular file. Its type is checked first, without
// following a link. Without O_NONBLOCK, a swap after the check is not
// caught. The open file's size is checked against limit, and the read
// stops past limit: a file that grows costs no more.
func (OS) ReadFile(path string, limit int64) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w (%v)", ErrNotRegular, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, tooLarge(fi.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, tooLarge(int64(len(data)), limit)
	}
	return data, nil
}
