package persist

// Exported for the tests in package persist_test.

// FileName is the name of the file of an unresolved record for key.
func FileName(key string) string { return fileName(key, false) }

// ResolvedFileName is the name of the file of a resolved record for key.
func ResolvedFileName(key string) string { return fileName(key, true) }

// Syncs returns how many fsync calls s has made.
func (s *FileStore) Syncs() int64 { return s.syncs.Load() }
