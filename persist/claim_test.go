package persist_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// deleteKey deletes the record stored with key, whatever its version: a
// test's clean-up. No record stored is not an error.
func deleteKey(ctx context.Context, s persist.Store, key string) error {
	cur, err := s.Get(ctx, key)
	if errors.Is(err, persist.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.Delete(ctx, cur)
}

// TestSaveIfChecksTheRecordItReplaces: SaveIf writes rec only if the
// record stored with rec.Key is old's version. An old of another key is
// not that version: checking old's key and then writing rec's would
// replace rec's record whatever it holds (a lost update). A nil old, or
// DeleteIf's, is refused with an error, not a panic.
func TestSaveIfChecksTheRecordItReplaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, open := range map[string]func(t *testing.T) persist.Store{
		"memory": func(*testing.T) persist.Store { return persist.NewMemory(nil) },
		"file":   func(t *testing.T) persist.Store { return openFile(t, newDir(t), nil) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			a, b := persisttest.NewRecord("a", t0), persisttest.NewRecord("b", t0)
			require.NoError(t, persisttest.Put(ctx, s, a))
			require.NoError(t, persisttest.Put(ctx, s, b))
			oldA, err := s.Get(ctx, "a")
			require.NoError(t, err)

			// Another Client moved b on; this caller writes b against a's version.
			moved := b.Clone()
			moved.State, moved.UpdatedAt = persist.StateSucceeded, t0.Add(time.Minute)
			require.NoError(t, persisttest.Put(ctx, s, moved))
			stale := b.Clone()
			stale.State, stale.UpdatedAt, stale.Rev = persist.StatePending, t0.Add(2*time.Minute), persist.NewRev()
			assert.Error(t, persist.SaveIf(ctx, s, stale, oldA), "b's stored record is not a's version")
			assert.Error(t, s.Write(ctx, stale, oldA), "b's stored record is not a's version")
			got, err := s.Get(ctx, "b")
			require.NoError(t, err)
			assert.Equal(t, persist.StateSucceeded, got.State, "b's outcome was overwritten")

			assert.Error(t, persist.SaveIf(ctx, s, stale, nil))
			assert.Error(t, persist.SaveDeferred(ctx, s, stale, nil))
			assert.Error(t, persist.DeleteIf(ctx, s, nil))
			assert.Error(t, s.Delete(ctx, nil))
		})
	}
}
