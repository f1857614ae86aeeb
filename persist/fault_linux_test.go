package persist_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

const writeFailEnv = "IDEM_WRITE_FAIL_CHILD_DIR"

// TestWriteFailChild is the child of TestFileWriteFails. With the file size
// limit (RLIMIT_FSIZE) set below the size of the record, the write of the
// temporary file fails with EFBIG, as it would with ENOSPC on a full disk:
// the same write in the same code path.
func TestWriteFailChild(t *testing.T) {
	dir := os.Getenv(writeFailEnv)
	if dir == "" {
		t.Skip("run by TestFileWriteFails as its child")
	}
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 4096, Max: 4096}))
	big := persisttest.NewRecord("k", t0)
	big.Body = make([]byte, 64<<10)
	err = persisttest.Put(context.Background(), s, big)
	require.ErrorIs(t, err, syscall.EFBIG)
	assert.ErrorContains(t, err, `"k"`, "the error names the intent")
	assert.ErrorContains(t, err, dir, "the error names the directory")
	t.Log(err)
	got, err := s.Get(context.Background(), "k")
	require.NoError(t, err)
	assert.Len(t, got.Body, len(persisttest.NewRecord("k", t0).Body), "the previous version stays")
}

// TestFileWriteFails checks that a save whose write fails reports it, and
// leaves the previous version of the record intact and no temporary file.
// A real full disk is not simulated: that needs a small file system mounted
// for the test.
func TestFileWriteFails(t *testing.T) {
	if os.Getenv(writeFailEnv) != "" {
		t.Skip("this is the child")
	}
	t.Parallel()
	dir := newDir(t)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	want := persisttest.NewRecord("k", t0)
	require.NoError(t, persisttest.Put(context.Background(), s, want))
	require.NoError(t, s.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestWriteFailChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), writeFailEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestWriteFailChild", "the child ran:\n%s", out)

	s = openFile(t, dir, nil)
	got, err := s.Get(context.Background(), "k")
	require.NoError(t, err)
	persisttest.AssertRecord(t, want, got)
	for _, name := range dirNames(t, dir) {
		assert.False(t, strings.HasPrefix(name, ".tmp-"), "temporary file %s left behind", name)
	}
}

// TestFileReadOnlyDir checks that a save into a directory that cannot be
// written fails clearly and changes nothing. Root ignores permission bits,
// so as root the directory is made immutable with chattr +i instead, and the
// test is skipped if that is not possible either.
func TestFileReadOnlyDir(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := newDir(t)
	s := openFile(t, dir, nil)
	want := persisttest.NewRecord("k", t0)
	require.NoError(t, persisttest.Put(ctx, s, want))

	if os.Geteuid() == 0 {
		if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
			t.Skipf("running as root, where chmod does not stop writes, and chattr +i failed: %v %s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("chattr", "-i", dir).Run() })
	} else {
		require.NoError(t, os.Chmod(dir, 0o500))
		t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
	}

	changed := persisttest.NewRecord("k", t0)
	changed.State = persist.StatePending
	err := persisttest.Put(ctx, s, changed)
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrPermission)
	assert.ErrorContains(t, err, `"k"`)
	assert.ErrorContains(t, err, dir)
	t.Log(err)
	err = persisttest.Put(ctx, s, persisttest.NewRecord("other", t0))
	assert.ErrorIs(t, err, os.ErrPermission)

	got, err := s.Get(ctx, "k")
	require.NoError(t, err)
	persisttest.AssertRecord(t, want, got)
	_, err = s.Get(ctx, "other")
	assert.ErrorIs(t, err, persist.ErrNotFound)
	data, err := os.ReadFile(filepath.Join(dir, persist.FileName("k", recName("k"))))
	require.NoError(t, err)
	assert.Contains(t, string(data), `"state":"new"`, "the file on disk is the previous version")
}
