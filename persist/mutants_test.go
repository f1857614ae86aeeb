package persist_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the power-cut test to kill the mutants of the file
// store's durability rules, and the conformance suite those of its rules
// for two Clients on one store. TestPowerCutCatchesMutants drops the steps of
// the scheme below the store, in the file system it writes through; these
// rows change the store's own code.
func TestMutants(t *testing.T) {
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "dir-not-synced-after-rename", File: "persist/file.go",
			Note:    "Save returns before the directory sync that makes its rename durable",
			Anchor:  "\t\tlocked = false\n\t\tif err := s.dirSync.sync(s.syncDir); err != nil {\n",
			Replace: "\t\tlocked = false\n\t\tif err := error(nil); err != nil {\n",
			Pkg:     "./persist", Run: "^TestPowerCut$",
			// Seed 1 kills it; a tenth of the default budget keeps the
			// unmutated run short.
			Env: []string{"IDEM_POWERCUTS=1000"},
		},
		{
			Name: "file-save-if-unchecked", File: "persist/file.go",
			Note:    "SaveIf saves over a record another client changed since it was read",
			Anchor:  "\tif err := unchanged(ctx, s, old); err != nil {\n\t\treturn err\n\t}\n\treturn s.save(ctx, rec, false)\n",
			Replace: "\treturn s.save(ctx, rec, false)\n",
			Pkg:     "./persist", Run: "^TestFileConformance$",
		},
		{
			Name: "memory-delete-if-unchecked", File: "persist/memory.go",
			Note:    "DeleteIf deletes a record another client took over since it was read",
			Anchor:  "\tif err := m.unchangedLocked(old); err != nil {\n\t\treturn err\n\t}\n\tdelete(m.recs, old.Key)\n",
			Replace: "\tdelete(m.recs, old.Key)\n",
			Pkg:     "./persist", Run: "^TestMemoryConformance$",
		},
	})
}
