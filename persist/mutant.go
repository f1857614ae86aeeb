//go:build !idem_mutant

package persist

// mutantNoDirSyncAfterRename skips the directory sync that makes a saved
// record's rename durable. It is a constant false here; the idem_mutant
// build (mutant_on.go) switches it on for internal/sim's mutant test.
const mutantNoDirSyncAfterRename = false
