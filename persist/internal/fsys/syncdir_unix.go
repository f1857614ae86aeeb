//go:build unix

package fsys

import (
	"errors"
	"os"
	"syscall"
)

// syncDir syncs the directory dir, so that the renames and removals in it
// survive a power loss. Some file systems cannot sync a directory and say so
// with EINVAL or ENOTSUP; there a rename is as durable as the file system
// makes it, and the sync does not fail for it. (On Darwin, os.File.Sync
// issues F_FULLFSYNC, which also flushes the drive's cache.)
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
		err = nil
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
