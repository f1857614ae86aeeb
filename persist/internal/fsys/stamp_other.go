//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package fsys

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Stamp uses the modification time as the change time, and no inode:
// package os gives no other portably (on Windows, the change time is not
// in the attributes os.Stat reads). A file rewritten in place whose
// modification time is set back, to the same size, is not seen to change.
func (OS) Stamp(path string) (Stamp, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return Stamp{}, err
	}
	t := fi.ModTime().UnixNano()
	return Stamp{Size: fi.Size(), Mod: t, Change: t}, nil
}

func (o OS) Stamps(dir string, names []string) ([]Stamp, error) {
	out := make([]Stamp, len(names))
	for i, name := range names {
		st, err := o.Stamp(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[i] = st
	}
	return out, nil
}
