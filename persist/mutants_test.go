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
			Name: "fallback-claim-not-one-step", File: "persist/claim.go",
			Note:    "Claim on a store without one-step methods lists and saves without the process's lock, so two Clients of one app both arm an intent for one action",
			Anchor:  "\toneStep.Lock()\n\tdefer oneStep.Unlock()\n\trecs, err := s.List(ctx, Filter{Name: rec.Name})\n",
			Replace: "\trecs, err := s.List(ctx, Filter{Name: rec.Name})\n",
			Pkg:     ".", Run: "^TestTwoClientsOnAStoreWithoutOneStepMethodsMakeOneKeyPerAction$",
		},
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
			Name: "stale-index-trusted", File: "persist/index.go",
			Note:    "OpenDir trusts an index written before the directory's last change (after a power cut, or an earlier release's save)",
			Anchor:  "\tif at != dirSt || idxSt.Change <= at.Change {\n",
			Replace: "\tif _ = dirSt; idxSt.Change <= at.Change {\n",
			Pkg:     "./persist", Run: "^TestPowerCut$",
			// Seed 1 kills it.
			Env: []string{"IDEM_POWERCUTS=1000"},
		},
		{
			Name: "index-same-tick-trusted", File: "persist/index.go",
			Note:    "OpenDir trusts an index not written after the directory's stamp, which a change within the clock's granularity leaves as it was",
			Anchor:  "\tif at != dirSt || idxSt.Change <= at.Change {\n",
			Replace: "\tif at != dirSt {\n",
			Pkg:     "./persist", Run: "^TestIndexSameTick$",
		},
		{
			Name: "index-file-change-ignored", File: "persist/index.go",
			Note:    "OpenDir takes a record from the index though its file was rewritten in place (damaged) since",
			Anchor:  "\t\t\tif st != ie.stamps[j] || st.Change >= idxSt.Change {\n",
			Replace: "\t\t\tif false {\n",
			Pkg:     "./persist", Run: "^TestIndexFileChangedInPlace$",
		},
		{
			Name: "index-checksum-ignored", File: "persist/index.go",
			Note:    "OpenDir reads a damaged index whose bytes still parse",
			Anchor:  "\tif crc32.Checksum(rest[5:], crcTable) != binary.LittleEndian.Uint32(rest[1:5]) {\n",
			Replace: "\tif false {\n",
			Pkg:     "./persist", Run: "^TestIndexDamagedIsRebuilt$",
		},
		{
			Name: "index-record-unchecked", File: "persist/index.go",
			Note:    "OpenDir takes a record from the index without checking that it belongs to the file it is filed under (an index damaged past its checksum, stale, or copied from another store)",
			Anchor:  "\tif err == nil {\n\t\terr = checkIndexed(ents)\n\t}\n",
			Replace: "",
			Pkg:     "./persist", Run: "^TestIndexRecordMustMatchItsFile$",
		},
		{
			Name: "index-file-order-unchecked", File: "persist/index.go",
			Note:    "OpenDir takes the first file an index lists for a key as the one that holds its record, though another of its files wins over it",
			Anchor:  "\t\t\tif !winsOver(ie.files[0], f) {\n",
			Replace: "\t\t\tif false {\n",
			Pkg:     "./persist", Run: "^TestIndexFilesInTheirOrder$",
		},
		{
			Name: "stamp-without-ctime", File: "persist/internal/fsys/stamp_unix.go",
			Note:    "a file's stamp takes its change time from its modification time, which a program sets back (os.Chtimes)",
			Anchor:  "Mod: st.Mtim.Nano(), Change: st.Ctim.Nano()}",
			Replace: "Mod: st.Mtim.Nano(), Change: st.Mtim.Nano()}",
			Pkg:     "./persist", Run: "^TestIndexFileSameSizeAndTime$",
		},
		{
			Name: "index-temp-left", File: "persist/file.go",
			Note:    "the temporary file of an index write cut short by a crash is never removed",
			Anchor:  "\t\tif strings.HasPrefix(de.Name(), tempPrefix) {\n",
			Replace: "\t\tif false {\n",
			Pkg:     "./persist", Run: "^TestIndexLeftoverTempRemoved$",
		},
		{
			Name: "listing-at-first-write", File: "persist/file.go",
			Note:    "after an OpenDir from the index the directory is listed by the first write, which waits for it (241 ms at 100,000 intents), not in the background",
			Anchor:  "\t\ts.listing = make(chan struct{})\n\t\ts.inflight.Add(1)\n\t\tgo s.listInBackground()\n",
			Replace: "",
			Pkg:     "./persist", Run: "^TestIndexListingInBackground$",
		},
		{
			Name: "listing-outlives-close", File: "persist/file.go",
			Note:    "Close does not wait for the listing OpenDir started in the background, which then touches the directory after Close returned",
			Anchor:  "func (s *FileStore) listInBackground() {\n\tdefer s.inflight.Done()\n",
			Replace: "func (s *FileStore) listInBackground() {\n\ts.inflight.Done()\n",
			Pkg:     "./persist", Run: "^TestIndexListingEndsBeforeClose$",
		},
		{
			Name: "save-before-scan", File: "persist/file.go",
			Note:    "a Save after an OpenDir from the index writes without knowing the key's resolved files, which then win over it",
			Anchor:  "\terr = s.complete()\n\tif err == nil {\n\t\terr = s.checkReplaceable(id)\n\t}\n",
			Replace: "\terr = s.checkReplaceable(id)\n",
			Pkg:     "./persist", Run: "^TestPowerCut$",
			// Seed 2 kills it.
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
			Anchor:  "\tif err := m.unchangedLocked(old); err != nil {\n\t\treturn err\n\t}\n\tm.removeLocked(old.Key)\n",
			Replace: "\tm.removeLocked(old.Key)\n",
			Pkg:     "./persist", Run: "^TestMemoryConformance$",
		},
		{
			Name: "memory-renamed-record-kept-under-old-name", File: "persist/memory.go",
			Note:    "a record saved again under another Name stays in its old Name's index, so that action's List and Claim still see it",
			Anchor:  "\tif had {\n\t\tm.unnameLocked(old)\n\t}\n",
			Replace: "",
			Pkg:     "./persist", Run: "^TestMemoryConformance$",
		},
	})
}
