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

// withMethods gives a store of this package the optional methods of
// persist.Store, as another's store would have them, each calling the
// function of the same name on the store it wraps, which does the work in
// one step through the store's own methods. So the conformance suite,
// which races Claims, SaveIfs and DeleteIfs only on a store with the
// methods, races those of this package's stores too.
type withMethods struct{ persist.Store }

func (s withMethods) Claim(ctx context.Context, rec *persist.Record) error {
	return persist.Claim(ctx, s.Store, rec)
}

func (s withMethods) SaveIf(ctx context.Context, rec, old *persist.Record) error {
	return persist.SaveIf(ctx, s.Store, rec, old)
}

func (s withMethods) DeleteIf(ctx context.Context, old *persist.Record) error {
	return persist.DeleteIf(ctx, s.Store, old)
}

func (s withMethods) PruneFunc(ctx context.Context, drop func(*persist.Record) bool) (int, error) {
	return persist.PruneFunc(ctx, s.Store, drop)
}

// countingFileStore is an app's wrapper of a FileStore that has the
// optional methods of its own, counting their calls.
type countingFileStore struct {
	*persist.FileStore
	calls []string
}

func (s *countingFileStore) Claim(ctx context.Context, rec *persist.Record) error {
	s.calls = append(s.calls, "Claim")
	return persist.Claim(ctx, s.FileStore, rec)
}

func (s *countingFileStore) SaveIf(ctx context.Context, rec, old *persist.Record) error {
	s.calls = append(s.calls, "SaveIf")
	return persist.SaveIf(ctx, s.FileStore, rec, old)
}

func (s *countingFileStore) DeleteIf(ctx context.Context, old *persist.Record) error {
	s.calls = append(s.calls, "DeleteIf")
	return persist.DeleteIf(ctx, s.FileStore, old)
}

func (s *countingFileStore) PruneFunc(ctx context.Context, drop func(*persist.Record) bool) (int, error) {
	s.calls = append(s.calls, "PruneFunc")
	return persist.PruneFunc(ctx, s.FileStore, drop)
}

func (s *countingFileStore) SaveDeferred(ctx context.Context, rec *persist.Record) error {
	s.calls = append(s.calls, "SaveDeferred")
	return persist.SaveDeferred(ctx, s.FileStore, rec)
}

// TestStoreMethodsAreUsed: the functions use a Store's own optional
// methods, even those of a wrapper around a FileStore, whose one-step
// methods would do the work otherwise.
func TestStoreMethodsAreUsed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := &countingFileStore{FileStore: openFile(t, newDir(t), nil)}
	rec := persisttest.NewRecord("k", t0)
	require.NoError(t, persist.Claim(ctx, s, rec))
	read, err := s.Get(ctx, "k")
	require.NoError(t, err)
	taken := read.Clone()
	taken.Holder, taken.UpdatedAt = "client-b", t0.Add(time.Second)
	require.NoError(t, persist.SaveIf(ctx, s, taken, read))
	done := taken.Clone()
	done.State, done.UpdatedAt = persist.StateSucceeded, t0.Add(2*time.Second)
	require.NoError(t, persist.SaveDeferred(ctx, s, done))
	n, err := persist.PruneFunc(ctx, s, func(*persist.Record) bool { return false })
	require.NoError(t, err)
	assert.Zero(t, n)
	require.NoError(t, persist.DeleteIf(ctx, s, done))
	assert.Equal(t, []string{"Claim", "SaveIf", "SaveDeferred", "PruneFunc", "DeleteIf"}, s.calls)
	_, err = s.Get(ctx, "k")
	assert.ErrorIs(t, err, persist.ErrNotFound)
}

// sealingFileStore is an app's wrapper of a FileStore that changes records
// on their way in (it would encrypt the body) and defines none of the
// optional methods.
type sealingFileStore struct{ *persist.FileStore }

func (s sealingFileStore) Save(ctx context.Context, rec *persist.Record) error {
	sealed := rec.Clone()
	sealed.Body = []byte("sealed")
	return s.FileStore.Save(ctx, sealed)
}

// TestFileStoreWrapperHasTheFileStoresMethods: a wrapper that embeds a
// *FileStore has its one-step methods, unexported as they are, as Store
// says: Claim, SaveIf and SaveDeferred write through the FileStore, not
// through the wrapper's Save.
func TestFileStoreWrapperHasTheFileStoresMethods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := sealingFileStore{openFile(t, newDir(t), nil)}
	rec := persisttest.NewRecord("k", t0)
	require.NoError(t, persist.Claim(ctx, s, rec))
	got, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, rec.Body, got.Body, "claimed through the FileStore")
	done := got.Clone()
	done.State, done.UpdatedAt = persist.StateSucceeded, t0.Add(time.Second)
	require.NoError(t, persist.SaveDeferred(ctx, s, done))
	got, err = s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, rec.Body, got.Body, "saved through the FileStore")
	require.NoError(t, s.Save(ctx, got))
	got, err = s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte("sealed"), got.Body, "Save is the wrapper's")
}
