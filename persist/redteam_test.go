package persist_test

// Red-team findings against the device store (persist.FileStore). Each test
// is named for the promise it breaks and fails while the finding stands.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// TestIndexNeverHidesAnUnresolvedIntent_FileRestoredInPlace: the index is
// a cache that "exists only while it describes" the record files; an
// intent whose outcome is unknown must never drop out of the unresolved
// list (Client.Unresolved, SettleAll, the clock mark seeding).
//
// Path to the failure: intent r is saved unresolved, its file is backed up,
// then r resolves and the store closes, writing an index that holds only
// the unresolved files and the directory's entry count. An engineer or a
// backup tool puts r's file back in place as it was (state unknown, e.g.
// the server's answer was not trusted). The entry count is unchanged, so
// merge marks every file the index does not hold as resolved without
// reading it, and the restored intent never shows in List{Unresolved}; the
// index written at Close keeps it out for every later OpenDir. A scan
// of the same directory lists it.
func TestIndexNeverHidesAnUnresolvedIntent_FileRestoredInPlace(t *testing.T) {
	ctx := context.Background()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	u := persisttest.NewRecord("u-1", t0)
	require.NoError(t, persisttest.Put(ctx, s, u))
	r := persisttest.NewRecord("r-1", t0.Add(time.Second))
	require.NoError(t, persisttest.Put(ctx, s, r))
	path := fileOfKey(t, dir, "r-1")
	backup, err := os.ReadFile(path)
	require.NoError(t, err)
	done := r.Clone()
	done.State, done.Response = persist.StateSucceeded, &persist.Response{StatusCode: 201}
	require.NoError(t, persisttest.Put(ctx, s, done))
	require.NoError(t, s.Close())
	require.FileExists(t, filepath.Join(dir, "index"))

	// Restored as it was: a new file (new inode, new ctime), same name.
	require.NoError(t, os.WriteFile(path+".restore", backup, 0o600))
	require.NoError(t, os.Rename(path+".restore", path))

	unresolvedKeys := func(s *persist.FileStore) []string {
		// A Get of a key the index does not hold waits for the listing.
		_, err := s.Get(ctx, "absent")
		require.True(t, errors.Is(err, persist.ErrNotFound))
		got, err := s.List(ctx, persist.Filter{Unresolved: true})
		require.NoError(t, err)
		return keysOf(got)
	}

	// Control: without the index, a scan lists both intents.
	scanDir := filepath.Join(t.TempDir(), "copy")
	require.NoError(t, os.Mkdir(scanDir, 0o700))
	for _, n := range dirNames(t, dir) {
		if n == "index" || n == "LOCK" || filepath.Ext(n) != ".json" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(scanDir, n), data, 0o600))
	}
	cs, err := persist.OpenDir(scanDir, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"u-1", "r-1"}, unresolvedKeys(cs), "control: a scan lists the restored intent")
	require.NoError(t, cs.Close())

	s, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	got := unresolvedKeys(s)
	require.NoError(t, s.Close())
	s, err = persist.OpenDir(dir, nil)
	require.NoError(t, err)
	again := unresolvedKeys(s)
	require.NoError(t, s.Close())
	require.ElementsMatch(t, []string{"u-1", "r-1"}, got,
		"the intent restored in place, whose outcome is unknown, is missing from the unresolved list: the index counted the same entries, so its file was taken as resolved unread")
	require.ElementsMatch(t, []string{"u-1", "r-1"}, again, "and stays missing after the next OpenDir")
}
