package persist_test

import (
	"context"
	"fmt"
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

// TestDeferredWriteMemory: a record written with WithDeferredSync reads
// back as one written without, the caller's record is left as it was,
// and Get still hands out copies.
func TestDeferredWriteMemory(t *testing.T) {
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

// TestDeferredWriteDiscardsBodies: the store's options apply to the stored
// record, and never to the caller's.
func TestDeferredWriteDiscardsBodies(t *testing.T) {
	ctx := context.Background()
	s := persist.NewMemory(&persist.Options{DiscardResponseBodies: true})
	rec := sharedRecord()
	require.NoError(t, shared(ctx, s, rec))
	got, err := s.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Nil(t, got.Response.Body)
	assert.Equal(t, []byte("ok"), rec.Response.Body)
}

// TestDeferredWriteRefuses: a deferred write refuses what any write
// refuses.
func TestDeferredWriteRefuses(t *testing.T) {
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

// TestDeferredWriteThroughAWrapper: a wrapper gets a deferred write
// through its own Write.
func TestDeferredWriteThroughAWrapper(t *testing.T) {
	ctx := context.Background()
	s := &writingStore{Store: persist.NewMemory(nil)}
	first := sharedRecord()
	require.NoError(t, s.Write(ctx, first, nil))
	done := sharedRecord()
	done.Rev = "rev-2"
	require.NoError(t, persist.SaveDeferred(ctx, s, done, first))
	assert.Equal(t, 2, s.writes)
}

// TestDeferredWriteCopiesLess: keeping the headers and bodies is the
// point.
func TestDeferredWriteCopiesLess(t *testing.T) {
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
