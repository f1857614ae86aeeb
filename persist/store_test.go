package persist_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// embedding is an app's wrapper that embeds a Store and adds nothing: it
// has exactly the methods of the interface. It must keep every rule of
// the store it wraps.
type embedding struct{ persist.Store }

// sealingFileStore is an app's wrapper of a FileStore that changes records
// on their way in (it would encrypt the body) and counts the changes it
// sees.
type sealingFileStore struct {
	*persist.FileStore
	writes, deletes int
}

func (s *sealingFileStore) Write(ctx context.Context, rec, old *persist.Record) error {
	s.writes++
	sealed := rec.Clone()
	sealed.Body = []byte("sealed")
	return s.FileStore.Write(ctx, sealed, old)
}

func (s *sealingFileStore) Delete(ctx context.Context, old *persist.Record) error {
	s.deletes++
	return s.FileStore.Delete(ctx, old)
}

// TestConformance: each store of the package keeps the rules of the
// Store interface, as persisttest checks them.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("the file store keeps the rules", func(t *testing.T) {
		t.Parallel()
		persisttest.Run(t, func(t *testing.T) persist.Store { return openFile(t, newDir(t), nil) })
	})
	t.Run("the memory store keeps the rules", func(t *testing.T) {
		t.Parallel()
		persisttest.Run(t, func(*testing.T) persist.Store { return persist.NewMemory(nil) })
	})
}

// TestWrapper: a wrapper of a store keeps its rules, and the package's
// functions write through the wrapper's own methods, never around them.
func TestWrapper(t *testing.T) {
	t.Parallel()
	t.Run("a wrapper that embeds a memory store passes the suite", func(t *testing.T) {
		t.Parallel()
		persisttest.Run(t, func(*testing.T) persist.Store { return embedding{persist.NewMemory(nil)} })
	})
	t.Run("a wrapper that embeds a file store passes the suite", func(t *testing.T) {
		t.Parallel()
		persisttest.Run(t, func(t *testing.T) persist.Store { return embedding{openFile(t, newDir(t), nil)} })
	})
	t.Run("every function writes through the wrapper's Write and Delete", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s := &sealingFileStore{FileStore: openFile(t, newDir(t), nil)}
		rec := persisttest.NewRecord("k", t0)
		rec.Seq, rec.Rev = 1, persist.NewRev()
		require.NoError(t, persist.Claim(ctx, s, rec))
		read, err := s.Get(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, []byte("sealed"), read.Body, "Claim")
		read.Body = rec.Body
		taken := read.Clone()
		taken.Holder, taken.UpdatedAt, taken.Rev = "client-b", t0.Add(time.Second), persist.NewRev()
		require.NoError(t, persist.SaveIf(ctx, s, taken, read))
		done := taken.Clone()
		done.State, done.UpdatedAt, done.Rev = persist.StateSucceeded, t0.Add(2*time.Second), persist.NewRev()
		require.NoError(t, persist.SaveDeferred(ctx, s, done, taken))
		got, err := s.Get(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, []byte("sealed"), got.Body, "SaveDeferred")
		assert.Equal(t, 3, s.writes)

		n, err := persist.PruneFunc(ctx, s, func(*persist.Record) bool { return true })
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, 1, s.deletes, "PruneFunc")
		_, err = s.Get(ctx, "k")
		assert.ErrorIs(t, err, persist.ErrNotFound)
		require.NoError(t, persist.DeleteIf(ctx, s, got))
		assert.Equal(t, 2, s.deletes, "DeleteIf")
	})
}
