//go:build idem_mutant

package persist

import "os"

// mutantNoDirSyncAfterRename skips the directory sync that makes a saved
// record's rename durable, when IDEM_MUTANT names it.
var mutantNoDirSyncAfterRename = os.Getenv("IDEM_MUTANT") == "dir-not-synced-after-rename"
