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

// plainStore is a Store of an app's own without the optional methods: the
// functions work through its Save, Get, List and Delete.
type plainStore struct{ persist.Store }

// TestSaveIfChecksTheRecordItReplaces: SaveIf saves rec only if the record
// stored with rec.Key is old's version. An old of another key is not that
// version: checking old's key and then writing rec's would replace rec's
// record whatever it holds (a lost update). A nil old, or DeleteIf's, is
// refused with an error, not a panic.
func TestSaveIfChecksTheRecordItReplaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, open := range map[string]func(t *testing.T) persist.Store{
		"memory": func(*testing.T) persist.Store { return persist.NewMemory(nil) },
		"file":   func(t *testing.T) persist.Store { return openFile(t, newDir(t), nil) },
		"plain":  func(*testing.T) persist.Store { return plainStore{persist.NewMemory(nil)} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			a, b := persisttest.NewRecord("a", t0), persisttest.NewRecord("b", t0)
			b.Name = "checkout:cart-7"
			require.NoError(t, s.Save(ctx, a))
			require.NoError(t, s.Save(ctx, b))
			oldA, err := s.Get(ctx, "a")
			require.NoError(t, err)

			// Another Client moved b on; this caller writes b against a's version.
			moved := b.Clone()
			moved.State, moved.UpdatedAt = persist.StateSucceeded, t0.Add(time.Minute)
			require.NoError(t, s.Save(ctx, moved))
			stale := b.Clone()
			stale.State, stale.UpdatedAt = persist.StatePending, t0.Add(2*time.Minute)
			assert.Error(t, persist.SaveIf(ctx, s, stale, oldA), "b's stored record is not a's version")
			got, err := s.Get(ctx, "b")
			require.NoError(t, err)
			assert.Equal(t, persist.StateSucceeded, got.State, "b's outcome was overwritten")

			assert.Error(t, persist.SaveIf(ctx, s, stale, nil))
			assert.Error(t, persist.DeleteIf(ctx, s, nil))
		})
	}
}
