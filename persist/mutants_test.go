package persist_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the power-cut test to kill the mutants of the file
// store's durability rules, the conformance suite those of its rules for
// two writers on one store, and TestFileLock that of the lock. The steps
// of the scheme below the store, in the file system it writes through,
// are dropped by TestPowerCut's subtest "each dropped step of the
// durability scheme is caught". These rows change the store's own code.
func TestMutants(t *testing.T) {
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "dir-not-synced-after-rename", File: "persist/write.go",
			Note:    "Save returns before the directory sync that makes its rename durable",
			Anchor:  "\t// durable. So concurrent saves share one.\n\tif err := s.dirSync.sync(s.syncDir); err != nil {\n",
			Replace: "\t// durable. So concurrent saves share one.\n\tif err := error(nil); err != nil {\n",
			Pkg:     "./persist", Run: "^TestPowerCut$/^no_saved_record_is_lost_or_changed$",
			// Seed 1 kills it; a tenth of the default budget keeps the
			// unmutated run short.
			Env: []string{"IDEM_POWERCUTS=1000"},
		},
		{
			Name: "index-kept-after-change", File: "persist/index.go",
			Note:    "the first change after the index was written leaves it in place: after a crash OpenDir trusts an index that misses the change",
			Anchor:  "\ts.changes++\n\tif !s.indexed {\n\t\treturn nil\n\t}\n",
			Replace: "\ts.changes++\n\tif true {\n\t\treturn nil\n\t}\n",
			Pkg:     "./persist", Run: "^TestPowerCut$/^no_saved_record_is_lost_or_changed$",
			// Seed 1 kills it.
			Env: []string{"IDEM_POWERCUTS=1000"},
		},
		{
			Name: "index-written-over-a-change", File: "persist/index.go",
			Note:    "the index is put in place though a record changed while it was written: it misses the change, and a store killed afterwards starts from it",
			Anchor:  "\tif s.changes != c {\n\t\terr = errIndex\n",
			Replace: "\tif _ = c; false {\n\t\terr = errIndex\n",
			Pkg:     "./persist", Run: "^TestIndex$/^its_write_gives_up_on_a_change$",
		},
		{
			Name: "index-same-tick-trusted", File: "persist/index.go",
			Note:    "OpenDir takes a record from the index though its file changed in the clock tick of the index's write, which may leave the file's stamp as the index holds it",
			Anchor:  "\t\tcase st != files[i].Stamp || st.Change >= idxSt.Change:\n",
			Replace: "\t\tcase st != files[i].Stamp:\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_file_changed_in_the_tick_of_its_write_is_read_again$",
		},
		{
			Name: "index-file-change-ignored", File: "persist/index.go",
			Note:    "OpenDir takes a record from the index though its file was rewritten in place (damaged) since",
			Anchor:  "\t\tcase st != files[i].Stamp || st.Change >= idxSt.Change:\n",
			Replace: "\t\tcase false:\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_file_rewritten_in_place_is_read_again$",
		},
		{
			Name: "index-checksum-ignored", File: "persist/index.go",
			Note:    "OpenDir reads a damaged index whose bytes still parse",
			Anchor:  "\tcase crc32.Checksum(rest[5:], crcTable) != binary.LittleEndian.Uint32(rest[1:5]):\n",
			Replace: "\tcase false:\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_damaged_index_is_rebuilt_by_a_scan$",
		},
		{
			Name: "index-record-unchecked", File: "persist/index.go",
			Note:    "OpenDir takes a record from the index without checking that it belongs to the file it is filed under (an index damaged past its checksum, stale, or copied from another store)",
			Anchor:  "\t\tif err := checkIndexed(e); err != nil {\n",
			Replace: "\t\tif err := error(nil); err != nil {\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_record_that_does_not_belong_to_its_file_is_not_used$",
		},
		{
			Name: "index-resolved-record-trusted", File: "persist/index.go",
			Note:    "OpenDir takes a resolved record from the index, which holds only unresolved ones: an index damaged past its checksum lists a paid intent as unresolved",
			Anchor:  "\tcase r.State.Resolved():\n",
			Replace: "\tcase false:\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_record_that_does_not_belong_to_its_file_is_not_used$",
		},
		{
			Name: "index-foreign-file-taken-for-resolved", File: "persist/file.go",
			Note:    "after an OpenDir from the index, a file the store did not know when it wrote the index (put there while it was open) is taken for a resolved record and never read",
			Anchor:  "\tindexed := s.fromIndex && listed(l) == s.known\n",
			Replace: "\tindexed := s.fromIndex\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_file_put_in_by_hand_is_listed_once_the_directory_is$",
		},
		{
			Name: "index-trusted-by-count-alone", File: "persist/file.go",
			Note:    "after an OpenDir from the index, a directory of as many files as the index counted is taken for the one it describes: a file swapped for another, or an index copied from another store, hides a pending intent",
			Anchor:  "\tindexed := s.fromIndex && listed(l) == s.known\n",
			Replace: "\tindexed := s.fromIndex && len(l) == s.known.n\n",
			Pkg:     "./persist", Run: "^TestIndex$/^(an_index_copied_from_another_store_is_not_used|a_file_swapped_for_another_at_the_same_count_is_read)$",
		},
		{
			Name: "index-type-kept-on-reread", File: "persist/index.go",
			Note:    "a file read again at OpenDir as its stamp changed keeps the type the index holds: a link replaced by the readable record stays damage",
			Anchor:  "\t\t\te.rec, e.st, e.mode = nil, fsys.Stamp{}, 0\n",
			Replace: "\t\t\te.rec, e.st = nil, fsys.Stamp{}\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_file_whose_type_changed_is_read_with_its_type_now$",
		},
		{
			Name: "index-count-one-byte-each", File: "persist/index.go",
			Note:    "a count of the index's files is checked against one byte per file, not the fewest a file takes: a count within the index's bytes allocates 72 times them",
			Anchor:  "\tif c.uint(&u); c.read && u > uint64(len(c.s)/least) {\n",
			Replace: "\tif c.uint(&u); c.read && u > uint64(len(c.s)) {\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_count_within_its_bytes_is_not_allocated_ahead$",
		},
		{
			Name: "stamp-without-ctime", File: "persist/internal/fsys/stamp_unix.go",
			Note:    "a file's stamp takes its change time from its modification time, which a program sets back (os.Chtimes)",
			Anchor:  "Mod: st.Mtim.Nano(), Change: st.Ctim.Nano()}",
			Replace: "Mod: st.Mtim.Nano(), Change: st.Mtim.Nano()}",
			Pkg:     "./persist", Run: "^TestIndex$/^a_file_rewritten_to_the_same_size_and_time_is_read_again$",
		},
		{
			Name: "temp-left", File: "persist/file.go",
			Note:    "the temporary file of a save or an index write cut short by a crash is never removed",
			Anchor:  "\t\tif strings.HasPrefix(name, tempPrefix) {\n",
			Replace: "\t\tif false {\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_leftover_temporary_file_is_removed$",
		},
		{
			Name: "listing-at-first-write", File: "persist/file.go",
			Note:    "after an OpenDir from the index the directory is listed by the first write, which waits for it (241 ms at 100,000 intents), not in the background",
			Anchor:  "\t\ts.listing = make(chan struct{})\n\t\ts.inflight.Add(1)\n\t\tgo s.listInBackground()\n",
			Replace: "",
			Pkg:     "./persist", Run: "^TestIndex$/^the_directory_is_listed_in_the_background$",
		},
		{
			Name: "listing-outlives-close", File: "persist/file.go",
			Note:    "Close does not wait for the listing OpenDir started in the background, which then touches the directory after Close returned",
			Anchor:  "func (s *FileStore) listInBackground() {\n\tdefer s.inflight.Done()\n",
			Replace: "func (s *FileStore) listInBackground() {\n\ts.inflight.Done()\n",
			Pkg:     "./persist", Run: "^TestIndex$/^the_listing_ends_before_Close_returns$",
		},
		{
			Name: "save-before-scan", File: "persist/write.go",
			Note:    "a write after an OpenDir from the index checks the action's records without waiting for the listing of the directory, so a new intent is taken for the latest over a resolved one the index does not hold",
			Anchor:  "\terr = s.complete()\n\tif err == nil {\n\t\terr = s.writableLocked(r, old)\n\t}\n",
			Replace: "\terr = s.writableLocked(r, old)\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_new_intent_waits_for_the_listing$",
		},
		{
			Name: "write-if-version-unchecked", File: "persist/claim.go",
			Note:    "a write replaces the stored record whatever its version: a client that took an intent over to send it is overwritten by one that read it before",
			Anchor:  "\t\tif cur == nil || old.Rev == \"\" || cur.Rev != old.Rev {\n",
			Replace: "\t\tif cur == nil {\n",
			Pkg:     "./persist", Run: "^TestConformance$/^the_memory_store_keeps_the_rules$",
		},
		{
			Name: "new-intent-unchecked", File: "persist/claim.go",
			Note:    "a write of a new intent wins whatever its action holds: two clients both make an intent for one action",
			Anchor:  "\tif !lost {\n",
			Replace: "\tif true || !lost {\n",
			Pkg:     "./persist", Run: "^TestConformance$/^the_memory_store_keeps_the_rules$",
		},
		{
			Name: "file-write-check-not-at-rename", File: "persist/write.go",
			Note:    "a file store checks a write only before writing its temporary file, not in one step with the rename: of two racing writes both win",
			Anchor:  "\tif err := s.writableLocked(r, old); err != nil {\n\t\t_ = s.fs.Remove(tmp)\n\t\treturn nil, err\n\t}\n",
			Replace: "",
			Pkg:     "./persist", Run: "^TestConformance$/^the_file_store_keeps_the_rules$",
		},
		{
			Name: "delete-if-version-unchecked", File: "persist/claim.go",
			Note:    "a delete removes the stored record whatever its version: an intent another client took over is deleted",
			Anchor:  "\tif cur != nil && cur.Rev != old.Rev {\n",
			Replace: "\tif false {\n",
			Pkg:     "./persist", Run: "^TestConformance$/^the_memory_store_keeps_the_rules$",
		},
		{
			Name: "version-by-fields", File: "persist/claim.go",
			Note:    "a writer recognises its write on re-read by the record's fields, not its Rev: another writer's version that looks alike is taken for its own",
			Anchor:  "\treturn a != nil && b != nil && a.Rev != \"\" && a.Key == b.Key && a.Rev == b.Rev\n",
			Replace: "\treturn a != nil && b != nil && a.Key == b.Key && a.State == b.State && a.UpdatedAt.Equal(b.UpdatedAt)\n",
			Pkg:     "./persist", Run: "^TestConformance$/^the_memory_store_keeps_the_rules$",
		},
		{
			Name: "version-not-new", File: "persist/claim.go",
			Note:    "a write may keep the Rev of the version it replaces, so that its result cannot be told on re-read",
			Anchor:  "\tif old.Rev == rec.Rev {\n",
			Replace: "\tif false {\n",
			Pkg:     "./persist", Run: "^TestConformance$/^the_memory_store_keeps_the_rules$",
		},
		{
			Name: "earlier-builds-lock-ignored", File: "persist/internal/fsys/lock_flock.go",
			Note:    "OpenDir locks the directory but not its LOCK file, which a process of the build before 797e7fd holds: two writers on one store",
			Anchor:  "\tf, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)\n\tif err == nil {\n\t\tif err = flock(f); err != nil {\n",
			Replace: "\tf, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)\n\tif err == nil {\n\t\tif false {\n",
			Pkg:     "./persist", Run: "^TestFileLock$",
		},
		{
			Name: "untagged-file-read", File: "persist/codec.go",
			Note:    "a file name without its action's tag is read as a record, whose damage then stops every action, where it is a stray file",
			Anchor:  "\tif len(tag) != tagLen || !canonical(tag) {\n",
			Replace: "\tif tag != \"\" && (len(tag) != tagLen || !canonical(tag)) {\n",
			Pkg:     "./persist", Run: "^TestDamage$/^a_stray_file_blocks_no_action$",
		},
		{
			Name: "record-changes-name", File: "persist/claim.go",
			Note:    "a write may move a record to another Name: the file store would keep two files of one key",
			Anchor:  "\t\tif cur.Name != rec.Name {\n",
			Replace: "\t\tif false {\n",
			Pkg:     "./persist", Run: "^TestConformance$/^the_memory_store_keeps_the_rules$",
		},
		{
			Name: "second-file-of-a-key-read", File: "persist/file.go",
			Note:    "a second file of a key, which the store never writes, is read as the key's record in place of the first, where both are damage",
			Anchor:  "\t\tif first := l[id]; id != \"\" && first != nil {\n",
			Replace: "\t\tif first := l[id]; false && first != nil {\n",
			Pkg:     "./persist", Run: "^TestDamage$/^two_files_of_a_key_are_damage_of_both_actions$",
		},
		{
			Name: "first-file-of-a-key-trusted", File: "persist/file.go",
			Note:    "of two files of one key, the first in name order is taken for the key's record: a copy sorting first hides the paid intent, and its action pays again",
			Anchor:  "\t\t\tfirst.twin, e.twin = true, true\n",
			Replace: "\t\t\te.twin = true\n",
			Pkg:     "./persist", Run: "^TestDamage$/^two_files_of_a_key_are_damage_of_both_actions$",
		},
		{
			Name: "twin-left-damaged-after-quarantine", File: "persist/write.go",
			Note:    "once one of two files of a key is quarantined, the other stays damage: the action's paid record can never be read again",
			Anchor:  "\tif e.twin {\n\t\ts.untwin(e.p.id)\n",
			Replace: "\tif false {\n\t\ts.untwin(e.p.id)\n",
			Pkg:     "./persist", Run: "^TestDamage$/^two_files_of_a_key_are_damage_of_both_actions$",
		},
		{
			Name: "twin-indexed-as-record", File: "persist/index.go",
			Note:    "the index does not say which of its files is a second file of a key: the next open takes the copy for the key's entry and gives the index up",
			Anchor:  "\t\tf := indexed{Name: e.name, Mode: e.mode, Twin: e.twin}\n",
			Replace: "\t\tf := indexed{Name: e.name, Mode: e.mode}\n",
			Pkg:     "./persist", Run: "^TestDamage$/^two_files_of_a_key_are_damage_of_both_actions$",
		},
		{
			Name: "read-blocks-on-a-fifo", File: "persist/internal/fsys/readfile_unix.go",
			Note:    "a file is opened for reading without O_NONBLOCK: a FIFO in the index's or a record's place blocks OpenDir for ever",
			Anchor:  "unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC",
			Replace: "unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC",
			Pkg:     "./persist", Run: "^TestOpenDir$/^an_index_that_is_not_a_regular_file_is_rebuilt_at_once$",
		},
		{
			Name: "read-type-unchecked", File: "persist/internal/fsys/readfile_unix.go",
			Note:    "an open file's type is not checked: a FIFO put in an indexed record's place is read, not reported as not a regular file",
			Anchor:  "\tif !fi.Mode().IsRegular() {\n",
			Replace: "\tif false {\n",
			Pkg:     "./persist", Run: "^TestOpenDir$/^an_indexed_file_replaced_by_a_FIFO_is_damage,_found_at_once$",
		},
		{
			Name: "text-not-utf8-kept", File: "persist/persist.go",
			Note:    "a Name, Key or request header that is not UTF-8 is written: JSON changes its bytes, so the record reads back unlike the one written",
			Anchor:  "\treturn r.validUTF8()\n",
			Replace: "\treturn nil\n",
			Pkg:     "./persist", Run: "^TestWrite$/^it_refuses_text_that_is_not_UTF-8_and_stores_nothing$",
		},
		{
			Name: "header-field-without-values-kept", File: "persist/store.go",
			Note:    "a store keeps a header field without values as an empty list, which the index gives back as nil: a record reads back differently from its file and from the index",
			Anchor:  "\t\tif vs != nil && len(vs) == 0 {\n",
			Replace: "\t\tif _ = vs; false {\n",
			Pkg:     "./persist", Run: "^TestIndex$/^every_field_of_a_record_comes_back_from_it$",
		},
		{
			Name: "index-count-unchecked", File: "persist/index.go",
			Note:    "an index's count of files or header fields is not checked against the bytes left: an index whose checksum holds but whose count runs past its end makes OpenDir allocate for it, or panic",
			Anchor:  "\tif c.uint(&u); c.read && u > uint64(len(c.s)/least) {\n",
			Replace: "\tif c.uint(&u); false {\n",
			Pkg:     "./persist", Run: "^TestIndex$/^a_count_past_its_end_is_refused,_not_allocated$",
		},
		{
			Name: "format-1-tag-changed", File: "persist/persist.go",
			Note:    "a JSON tag of Record changes within format 1: files written before the change read back without that field",
			Anchor:  "\tKeyHeader string `json:\"key_header,omitempty\"`\n",
			Replace: "\tKeyHeader string `json:\"keyheader,omitempty\"`\n",
			Pkg:     "./persist", Run: "^TestFormat$/^each_state's_golden_record_reads_back_and_writes_its_bytes$",
		},
	})
}
