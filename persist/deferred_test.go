package persist_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/internal/fsys"
	"github.com/idemkit/idem/persist/persisttest"
)

// TestDeferredSync: a write with WithDeferredSync is checked as any
// other, and a power loss before its sync leaves the previous version,
// whole. The parent is not parallel: the count of allocations runs
// alone.
func TestDeferredSync(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"a resolving save returns before its sync", saveDeferredResolves},
		{"a new record is synced before Write returns", saveDeferredIsDurableOtherwise},
		{"a failed background sync is tried again at Close", saveDeferredSyncFails},
		{"a write whose sync failed is recognised by its Rev", fileWriteWhoseSyncFailed},
		{"the memory store reads it back as any write", deferredWriteMemory},
		{"the store options apply to the stored record alone", deferredWriteDiscardsBodies},
		{"it refuses what any write refuses", deferredWriteRefuses},
		{"a wrapper gets it through its own Write", deferredWriteThroughAWrapper},
		{"the memory store copies less", deferredWriteCopiesLess},
	} {
		t.Run(c.name, c.run)
	}
}

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

// saveDeferredResolves: the save that resolves a record returns while
// the directory sync is held, reads back at once, and replaces the
// record's file in place: there is one file, before and after the sync
// (Close waits for it).
func saveDeferredResolves(t *testing.T) {
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

// saveDeferredIsDurableOtherwise: a new record is saved durably:
// SaveDeferred waits for its sync.
func saveDeferredIsDurableOtherwise(t *testing.T) {
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

// saveDeferredSyncFails: when the background sync fails, the save
// stays to be synced, and Close tries again and reports the failure.
func saveDeferredSyncFails(t *testing.T) {
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

// fileWriteWhoseSyncFailed: a write whose directory sync failed
// returns an error, though its record is in place: its writer recognises
// it by its Rev on re-read, and another writer's version is refused.
func fileWriteWhoseSyncFailed(t *testing.T) {
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

func sharedRecord() *persist.Record {
	now := time.Date(2026, 3, 1, 12, 0, 0, 5, time.FixedZone("AZT", 4*3600))
	return &persist.Record{
		Key: "k1", Rev: "rev-1", KeyHeader: "k1", Seq: 3, Method: http.MethodPost, URL: "https://x/pay",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":1}`),
		CreatedAt: now, UpdatedAt: now, State: persist.StateSucceeded,
		Clocks:   &persist.Clocks{Mark: now, ArmMark: now},
		Response: &persist.Response{StatusCode: 201, Header: http.Header{"X": {"y"}}, Body: []byte("ok")},
	}
}

// shared writes rec to s as a new intent, with WithDeferredSync: the
// memory store keeps rec's headers and bodies without copying them.
func shared(ctx context.Context, s persist.Store, rec *persist.Record) error {
	return s.Write(persist.WithDeferredSync(ctx), rec, nil)
}

// deferredWriteMemory: a record written with WithDeferredSync reads
// back as one written without, the caller's record is left as it was,
// and Get still hands out copies.
func deferredWriteMemory(t *testing.T) {
	ctx := context.Background()
	viaWrite, viaShared := persist.NewMemory(nil), persist.NewMemory(nil)
	require.NoError(t, viaWrite.Write(ctx, sharedRecord(), nil))
	rec := sharedRecord()
	require.NoError(t, shared(ctx, viaShared, rec))
	assert.Equal(t, sharedRecord(), rec, "the caller's record is not changed")

	want, err := viaWrite.Get(ctx, "k1")
	require.NoError(t, err)
	got, err := viaShared.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, persist.FormatVersion, got.Version)
	assert.Equal(t, time.UTC, got.CreatedAt.Location())

	got.Header.Set("Content-Type", "text/plain")
	got.Body[0] = 'X'
	got.Response.Header.Set("X", "z")
	again, err := viaShared.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, want, again, "Get hands out copies")
	assert.Equal(t, sharedRecord(), rec, "nor do changes to them reach the written record")
}

// deferredWriteDiscardsBodies: the store's options apply to the stored
// record, and never to the caller's.
func deferredWriteDiscardsBodies(t *testing.T) {
	ctx := context.Background()
	s := persist.NewMemory(&persist.Options{DiscardResponseBodies: true})
	rec := sharedRecord()
	require.NoError(t, shared(ctx, s, rec))
	got, err := s.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Nil(t, got.Response.Body)
	assert.Equal(t, []byte("ok"), rec.Response.Body)
}

// deferredWriteRefuses: a deferred write refuses what any write
// refuses.
func deferredWriteRefuses(t *testing.T) {
	ctx := context.Background()
	s := persist.NewMemory(nil)
	bad := sharedRecord()
	bad.State = "done"
	require.Error(t, shared(ctx, s, bad))
	far := sharedRecord()
	far.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Error(t, shared(ctx, s, far))
	require.Error(t, shared(ctx, s, nil))
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, shared(canceled, s, sharedRecord()), context.Canceled)
	_, err := s.Get(ctx, "k1")
	require.ErrorIs(t, err, persist.ErrNotFound)
}

// writingStore is a Store that counts its Writes; it wraps a memory
// store, as a wrapper might.
type writingStore struct {
	persist.Store
	writes int
}

func (s *writingStore) Write(ctx context.Context, rec, old *persist.Record) error {
	s.writes++
	return s.Store.Write(ctx, rec, old)
}

// deferredWriteThroughAWrapper: a wrapper gets a deferred write
// through its own Write.
func deferredWriteThroughAWrapper(t *testing.T) {
	ctx := context.Background()
	s := &writingStore{Store: persist.NewMemory(nil)}
	first := sharedRecord()
	require.NoError(t, s.Write(ctx, first, nil))
	done := sharedRecord()
	done.Rev = "rev-2"
	require.NoError(t, persist.SaveDeferred(ctx, s, done, first))
	assert.Equal(t, 2, s.writes)
}

// deferredWriteCopiesLess: keeping the headers and bodies is the
// point.
func deferredWriteCopiesLess(t *testing.T) {
	ctx := context.Background()
	s := persist.NewMemory(nil)
	recs := make([]*persist.Record, 120)
	for i := range recs {
		recs[i] = sharedRecord()
		recs[i].Rev = fmt.Sprintf("rev-%d", i)
	}
	require.NoError(t, s.Write(ctx, recs[0], nil))
	i := 0
	write := func(ctx context.Context) {
		i++
		if err := s.Write(ctx, recs[i], recs[i-1]); err != nil {
			t.Fatal(err)
		}
	}
	plain := testing.AllocsPerRun(50, func() { write(ctx) })
	dctx := persist.WithDeferredSync(ctx)
	deferred := testing.AllocsPerRun(50, func() { write(dctx) })
	assert.Less(t, deferred, plain/3, "Write %v allocations, deferred %v", plain, deferred)
}
