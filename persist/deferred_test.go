package persist_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/internal/fsys"
	"github.com/idemkit/idem/persist/persisttest"
)

// gatedFS holds every directory sync until release is closed, and counts
// them.
type gatedFS struct {
	fsys.FS
	release  chan struct{}
	dirSyncs atomic.Int64
	fail     atomic.Bool
}

func (g *gatedFS) SyncDir(dir string) error {
	<-g.release
	g.dirSyncs.Add(1)
	if g.fail.Load() {
		return errors.New("sync refused")
	}
	return g.FS.SyncDir(dir)
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, de := range des {
		if de.Name() != "index" && de.Name() != "LOCK" {
			out = append(out, de.Name())
		}
	}
	slices.Sort(out)
	return out
}

// TestSaveDeferredResolves: the save that resolves a record returns while
// the directory sync is held, reads back at once, and replaces the
// record's file in place: there is one file, before and after the sync
// (Close waits for it).
func TestSaveDeferredResolves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, err := filepath.Abs(newDir(t))
	require.NoError(t, err)
	g := &gatedFS{FS: fsys.OS{}, release: make(chan struct{})}
	close(g.release)
	s, err := persist.OpenDirFS(g, dir, nil)
	require.NoError(t, err)
	r := saveNamed(t, s, "k", "checkout:a", 0, false)
	g.release = make(chan struct{}) // hold the syncs from now on

	done := *r
	done.State, done.Rev = persist.StateSucceeded, persist.NewRev()
	done.Response = &persist.Response{StatusCode: 201, Body: []byte(`{"id":"pay_1"}`)}
	require.NoError(t, persist.SaveDeferred(ctx, s, &done, r), "returns with the directory sync held")
	got, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, persist.StateSucceeded, got.State)
	assert.Equal(t, []string{persist.FileName("k", r.Name)}, names(t, dir), "replaced in place")

	close(g.release)
	require.NoError(t, s.Close())
	assert.Equal(t, []string{persist.FileName("k", r.Name)}, names(t, dir))
	s2 := openFile(t, dir, nil)
	got, err = s2.Get(ctx, "k")
	require.NoError(t, err)
	persisttest.AssertRecord(t, &done, got)
}

// TestSaveDeferredIsDurableOtherwise: a new record is saved durably:
// SaveDeferred waits for its sync.
func TestSaveDeferredIsDurableOtherwise(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, err := filepath.Abs(newDir(t))
	require.NoError(t, err)
	g := &gatedFS{FS: fsys.OS{}, release: make(chan struct{})}
	close(g.release)
	s, err := persist.OpenDirFS(g, dir, nil)
	require.NoError(t, err)
	defer s.Close()

	before := g.dirSyncs.Load()
	r := saveNamed(t, s, "k", "checkout:a", 0, true) // resolved from the start
	fresh := *r
	fresh.Key, fresh.Name, fresh.Rev = "k2", "checkout:b", persist.NewRev()
	require.NoError(t, s.Write(persist.WithDeferredSync(ctx), &fresh, nil), "a new record")
	assert.Equal(t, before+2, g.dirSyncs.Load(), "one directory sync for each new record, before returning")
}

// TestSaveDeferredSyncFails: when the background sync fails, the save
// stays to be synced, and Close tries again and reports the failure.
func TestSaveDeferredSyncFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, err := filepath.Abs(newDir(t))
	require.NoError(t, err)
	g := &gatedFS{FS: fsys.OS{}, release: make(chan struct{})}
	close(g.release)
	s, err := persist.OpenDirFS(g, dir, nil)
	require.NoError(t, err)
	r := saveNamed(t, s, "k", "checkout:a", 0, false)

	g.fail.Store(true)
	done := *r
	done.State, done.Rev = persist.StateFailed, persist.NewRev()
	done.Response = &persist.Response{StatusCode: 402}
	require.NoError(t, persist.SaveDeferred(ctx, s, &done, r))
	require.True(t, s.WaitDeferred() == false, "the sync failed; the save is still to be synced")
	assert.Len(t, names(t, dir), 1)
	require.Error(t, s.Close(), "Close says the save may not survive a power loss")

	s2 := openFile(t, dir, nil)
	got, err := s2.Get(ctx, "k")
	require.NoError(t, err)
	persisttest.AssertRecord(t, &done, got)
}

// TestFileWriteWhoseSyncFailed: a write whose directory sync failed
// returns an error, though its record is in place: its writer recognises
// it by its Rev on re-read, and another writer's version is refused.
func TestFileWriteWhoseSyncFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, err := filepath.Abs(newDir(t))
	require.NoError(t, err)
	g := &gatedFS{FS: fsys.OS{}, release: make(chan struct{})}
	close(g.release)
	s, err := persist.OpenDirFS(g, dir, nil)
	require.NoError(t, err)
	defer s.Close()
	r := saveNamed(t, s, "k", "checkout:a", 0, false)

	g.fail.Store(true)
	next := r.Clone()
	next.State, next.Rev = persist.StatePending, persist.NewRev()
	err = s.Write(ctx, next, r)
	require.ErrorContains(t, err, "may not survive a power loss")
	g.fail.Store(false)
	got, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.True(t, persist.SameVersion(got, next), "the write is recognised on re-read")
	rival := r.Clone()
	rival.Rev = persist.NewRev()
	var ce *persist.ConflictError
	require.ErrorAs(t, s.Write(ctx, rival, r), &ce, "a writer of the version before")
	assert.True(t, persist.SameVersion(ce.Current, next))
}
