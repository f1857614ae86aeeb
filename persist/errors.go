package persist

import "errors"

// ErrLocked is returned by OpenDir when another store has the directory
// open, in this process or another one. Two writers on one directory
// could interleave versions of an intent. So the second opener is
// refused.
var ErrLocked = errors.New("persist: store directory is in use by another store")

// ErrClosed is returned by the methods of a FileStore after Close.
var ErrClosed = errors.New("persist: store is closed")

// ErrNewerVersion is wrapped in the *CorruptError for a record written
// by a newer release. Its FormatVersion is higher than this release's.
// Such a record is never read as an older one, and never overwritten.
// Upgrade the app instead of removing the file.
var ErrNewerVersion = errors.New("persist: record was written by a newer release")

// errInsecureDir is returned by OpenDir when the directory exists and
// other users may read or enter it. Stored bodies may be sensitive. So
// the store refuses to write them where others can read them.
var errInsecureDir = errors.New("persist: store directory is accessible to other users")
