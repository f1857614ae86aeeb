package fsys

import (
	"errors"

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
// the kernel a lookup of dir's path for each.
func (OS) Stamps(dir string, names []string) ([]Stamp, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	out := make([]Stamp, len(names))
	var st unix.Stat_t
	for i, name := range names {
		err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[i] = stampOf(&st)
	}
	return out, nil
}

func stampOf(st *unix.Stat_t) Stamp {
	return Stamp{Ino: st.Ino, Size: st.Size, Mod: st.Mtim.Nano(), Change: st.Ctim.Nano()}
}
