//go:build !unix

package fsys

// syncDir does nothing where the os package cannot sync a directory
// (Windows). There a rename's durability is left to the file system's
// metadata journal, which may lose the last renames on a power loss; the
// record files themselves are still synced before the rename.
func syncDir(string) error { return nil }
