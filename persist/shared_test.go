package persist_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
)

func sharedRecord() *persist.Record {
	now := time.Date(2026, 3, 1, 12, 0, 0, 5, time.FixedZone("AZT", 4*3600))
	return &persist.Record{
		Key: "k1", KeyHeader: "k1", Seq: 3, Method: http.MethodPost, URL: "https://x/pay",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":1}`),
		CreatedAt: now, UpdatedAt: now, State: persist.StateSucceeded,
		Clocks:   &persist.Clocks{Mark: now, ArmMark: now},
		Response: &persist.Response{StatusCode: 201, Header: http.Header{"X": {"y"}}, Body: []byte("ok")},
	}
}

// TestSaveSharedMemory: a record saved with SaveShared reads back as one
// saved with Save, the caller's record is left as it was, and Get still
// hands out copies.
func TestSaveSharedMemory(t *testing.T) {
	ctx := context.Background()
	viaSave, viaShared := persist.NewMemory(nil), persist.NewMemory(nil)
	require.NoError(t, viaSave.Save(ctx, sharedRecord()))
	rec := sharedRecord()
	require.NoError(t, persist.SaveShared(ctx, viaShared, rec))
	assert.Equal(t, sharedRecord(), rec, "the caller's record is not changed")

	want, err := viaSave.Get(ctx, "k1")
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
	assert.Equal(t, sharedRecord(), rec, "nor do changes to them reach the saved record")
}

// TestSaveSharedDiscardsBodies: the store's options apply to the stored
// record, and never to the caller's.
func TestSaveSharedDiscardsBodies(t *testing.T) {
	ctx := context.Background()
	s := persist.NewMemory(&persist.Options{DiscardResponseBodies: true})
	rec := sharedRecord()
	require.NoError(t, persist.SaveShared(ctx, s, rec))
	got, err := s.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Nil(t, got.Response.Body)
	assert.Equal(t, []byte("ok"), rec.Response.Body)
}

// TestSaveSharedRefuses: SaveShared refuses what Save refuses.
func TestSaveSharedRefuses(t *testing.T) {
	ctx := context.Background()
	s := persist.NewMemory(nil)
	bad := sharedRecord()
	bad.State = "done"
	require.Error(t, persist.SaveShared(ctx, s, bad))
	far := sharedRecord()
	far.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Error(t, persist.SaveShared(ctx, s, far))
	require.Error(t, persist.SaveShared(ctx, s, nil))
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, persist.SaveShared(canceled, s, sharedRecord()), context.Canceled)
	_, err := s.Get(ctx, "k1")
	require.ErrorIs(t, err, persist.ErrNotFound)
}

// savingStore is a Store that counts its Saves; it wraps a memory store,
// as a wrapper might.
type savingStore struct {
	persist.Store
	saves int
}

func (s *savingStore) Save(ctx context.Context, rec *persist.Record) error {
	s.saves++
	return s.Store.Save(ctx, rec)
}

// TestSaveSharedOtherStores: any other store gets the record through its
// Save, even one that wraps a memory store.
func TestSaveSharedOtherStores(t *testing.T) {
	s := &savingStore{Store: persist.NewMemory(nil)}
	require.NoError(t, persist.SaveShared(context.Background(), s, sharedRecord()))
	assert.Equal(t, 1, s.saves)
}

// TestSaveSharedCopiesLess: keeping the headers and bodies is the point.
func TestSaveSharedCopiesLess(t *testing.T) {
	ctx := context.Background()
	s := persist.NewMemory(nil)
	rec := sharedRecord()
	save := testing.AllocsPerRun(50, func() { _ = s.Save(ctx, rec) })
	shared := testing.AllocsPerRun(50, func() { _ = persist.SaveShared(ctx, s, rec) })
	assert.Less(t, shared, save/3, "Save %v allocations, SaveShared %v", save, shared)
}
