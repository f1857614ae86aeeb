//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package fsys

import (
	"fmt"
	"os"
)

// ReadFile reads a regular file. Its type is checked first, without
// following a link. Without O_NONBLOCK, a swap after the check is not
// caught.
func (OS) ReadFile(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w (%v)", ErrNotRegular, fi.Mode().Type())
	}
	return os.ReadFile(path)
}
