package persist

import "errors"

// ErrLocked is returned by OpenDir when another store, in this process or
// another one, has the directory open. Two writers on one directory could
// interleave versions of an intent, so the second opener is refused instead.
var ErrLocked = errors.New("persist: store directory is in use by another store")

// ErrClosed is returned by the methods of a FileStore after Close.
var ErrClosed = errors.New("persist: store is closed")

// ErrNewerVersion is wrapped in the *CorruptError for a record written by a
// newer release (its FormatVersion is higher than this release's). Such a
// record is never read as if it were an older one, and never overwritten:
// upgrade the app instead of removing the file.
var ErrNewerVersion = errors.New("persist: record was written by a newer release")

// errInsecureDir is returned by OpenDir when the directory exists and other
// users may read or enter it. Stored bodies may be sensitive, so the store
// refuses rather than writing them where others can read them.
var errInsecureDir = errors.New("persist: store directory is accessible to other users")
