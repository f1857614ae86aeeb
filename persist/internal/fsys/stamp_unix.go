//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package fsys

import (
	"errors"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

func (OS) Stamp(path string) (Stamp, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return Stamp{}, err
	}
	return stampOf(&st), nil
}

// Stamps stats every name through one descriptor of dir, which spares
// the kernel a lookup of dir's path for each, on up to GOMAXPROCS threads
// for many names: the system calls are most of the cost.
func (OS) Stamps(dir string, names []string) ([]Stamp, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	out := make([]Stamp, len(names))
	const minChunk = 1024
	n := min(runtime.GOMAXPROCS(0), (len(names)+minChunk-1)/minChunk, 8)
	if n <= 1 {
		return out, stampRange(fd, names, out)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	size := (len(names) + n - 1) / n
	for i := range n {
		lo, hi := i*size, min((i+1)*size, len(names))
		wg.Go(func() { errs[i] = stampRange(fd, names[lo:hi], out[lo:hi]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func stampRange(fd int, names []string, out []Stamp) error {
	var st unix.Stat_t
	for i, name := range names {
		err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return err
		}
		out[i] = stampOf(&st)
	}
	return nil
}

// stampOf takes the change time (ctime) and the inode number as well as
// the modification time and the size: a file rewritten in place and its
// modification time set back (os.Chtimes), or replaced by another file of
// the same size and time, keeps those two, never its ctime, which no
// program can set, nor (when replaced) its inode. These systems (Android
// and iOS included, as linux and darwin) all name the fields Mtim and Ctim
// in golang.org/x/sys/unix.
func stampOf(st *unix.Stat_t) Stamp {
	return Stamp{Ino: st.Ino, Size: st.Size, Mod: st.Mtim.Nano(), Change: st.Ctim.Nano()}
}
