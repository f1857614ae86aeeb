package persist

// Exported for the tests in package persist_test.

var FileName = fileName

// Syncs returns how many fsync calls s has made.
func (s *FileStore) Syncs() int64 { return s.syncs.Load() }
