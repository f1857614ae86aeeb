//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package persist_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gofrs/flock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
)

// lockChildEnv names the store directory of TestEarlierBuildsLockChild;
// lockChildModeEnv says what it does: "hold" the LOCK file until its stdin
// closes, or "try" it once and say whether it got it.
const (
	lockChildEnv     = "IDEM_LOCK_CHILD_DIR"
	lockChildModeEnv = "IDEM_LOCK_CHILD_MODE"
)

// TestEarlierBuildsLockChild is the child of TestFileLock: a process of
// the build before the store locked its directory itself, which took
// flock(2) on the directory's LOCK file through github.com/gofrs/flock,
// as it did then.
func TestEarlierBuildsLockChild(t *testing.T) {
	dir := os.Getenv(lockChildEnv)
	if dir == "" {
		t.Skip("run by TestFileLock as its child")
	}
	lk := flock.New(filepath.Join(dir, "LOCK"), flock.SetPermissions(0o600))
	ok, err := lk.TryLock()
	if err != nil {
		fmt.Println("error", err)
		return
	}
	if !ok {
		fmt.Println("refused")
		return
	}
	fmt.Println("held")
	if os.Getenv(lockChildModeEnv) == "hold" {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes it
	}
	_ = lk.Unlock()
}

// earlierBuild starts a process of the earlier build on dir in mode, and
// returns the first line it prints and, for "hold", a function that ends
// it.
func earlierBuild(t *testing.T, dir, mode string) (string, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestEarlierBuildsLockChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir, lockChildModeEnv+"="+mode)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	end := func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	if err != nil {
		end()
		t.Fatalf("the child printed nothing: %v", err)
	}
	if mode != "hold" {
		end()
	}
	t.Cleanup(end)
	return strings.TrimSpace(line), end
}

// TestFileLock: no two builds open one directory at once. This build locks
// the directory itself and, as the build before it did, its LOCK file.
func TestFileLock(t *testing.T) {
	if os.Getenv(lockChildEnv) != "" {
		t.Skip("this is the child")
	}
	t.Parallel()
	t.Run("an earlier build's process holding LOCK keeps OpenDir out", func(t *testing.T) {
		t.Parallel()
		dir := newDir(t)
		require.NoError(t, os.MkdirAll(dir, 0o700))
		got, end := earlierBuild(t, dir, "hold")
		require.Equal(t, "held", got)

		_, err := persist.OpenDir(dir, nil)
		require.ErrorIs(t, err, persist.ErrLocked)
		assert.ErrorContains(t, err, filepath.Join(dir, "LOCK"), "the error names the lock file")
		assert.ErrorContains(t, err, "earlier build", "and who may hold it")
		t.Log(err)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			assert.Equal(t, "LOCK", e.Name(), "the refused OpenDir wrote nothing")
		}

		end()
		openFile(t, dir, nil) // free once the other process is gone
	})
	t.Run("an earlier build's process cannot lock a directory this build has open", func(t *testing.T) {
		t.Parallel()
		dir := newDir(t)
		s, err := persist.OpenDir(dir, nil)
		require.NoError(t, err)
		got, _ := earlierBuild(t, dir, "try")
		assert.Equal(t, "refused", got)
		require.NoError(t, s.Close())
		got, _ = earlierBuild(t, dir, "try")
		assert.Equal(t, "held", got, "Close released it")
	})
}
