package persist_test

// Red-team findings against the device store. Each test fails while the
// weakness it names is in the code. Every attack goes through the public
// API of package persist and a real directory in t.TempDir().

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// TestWriteReadsBackAsWrittenResponseHeaderNotUTF8 breaks the Store
// contract ("A record reads back as written") and the file-layout promise
// that bytes JSON would change are refused with an error ("So Write
// refuses a Key, a Name or a request header that is not UTF-8").
//
// Path to the failure: Validate checks only the request's header for
// UTF-8, not the stored Response's header. A server's answer may carry
// obs-text bytes (a Latin-1 filename, a bank's reference) that net/http
// accepts. Write of the resolved intent succeeds, but json.Marshal turns
// each byte that is not UTF-8 into U+FFFD. Get returns another header
// than the server sent and than the memory store returns, silently.
func TestWriteReadsBackAsWrittenResponseHeaderNotUTF8(t *testing.T) {
	ctx := context.Background()
	s, err := persist.OpenDir(rtDir(t), nil)
	require.NoError(t, err)
	defer s.Close()
	r := rtResolved("k-latin1", rtT0)
	r.Response.Header.Set("X-Payment-Ref", "caf\xe9-42")
	err = persisttest.Put(ctx, s, r)
	if err != nil {
		return // refused with an error: the promise holds
	}
	got, err := s.Get(ctx, "k-latin1")
	require.NoError(t, err)
	if g := got.Response.Header.Get("X-Payment-Ref"); g != "caf\xe9-42" {
		t.Fatalf("the stored answer's header reads back as %q, written as %q, and Write returned nil", g, "caf\xe9-42")
	}
}

// rtChildEnv names the directory a child test process opens.
const rtChildEnv = "IDEM_REDTEAM_HUGE_DIR"

// TestOpenDirSurvivesHugeSparseFile breaks "bad input gets a clear error"
// and the Damage promise: a file that cannot be read "gives a
// *CorruptError", and a damaged index "is rebuilt by a full scan. It is
// never an error of OpenDir."
//
// Path to the failure: the store reads a record file, and the index, with
// one allocation of the size the file has (fsys.ReadFile: "The read stops
// at the size the open file had"), with no limit on that size. A damaged
// file system, or a hostile file, gives a record file or the index a size
// of a terabyte, which costs no disk space as a sparse file. OpenDir (for
// the index) or its scan (for a record) then asks the Go runtime for a
// terabyte, and the process dies with "fatal error: out of memory": no
// CorruptError, no recover. The app dies at every start, so no intent of
// the store can be settled until someone finds the file by hand.
func TestOpenDirSurvivesHugeSparseFile(t *testing.T) {
	if dir := os.Getenv(rtChildEnv); dir != "" {
		// The child: open and list as an app does at start.
		s, err := persist.OpenDir(dir, nil)
		if err != nil {
			fmt.Println("OPEN-ERROR:", err)
			return
		}
		_, err = s.List(context.Background(), persist.Filter{})
		fmt.Printf("LISTED: corrupt=%d\n", len(persist.CorruptErrors(err)))
		_ = s.Close()
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("sparse files and overcommit as on Linux")
	}
	const huge = 1 << 40 // 1 TB, sparse: no disk space
	for _, which := range []string{"record", "index"} {
		t.Run(which, func(t *testing.T) {
			dir := rtDir(t)
			rtFill(t, dir, rtResolved("ok-1", rtT0))
			var path string
			if which == "record" {
				require.NoError(t, os.Remove(filepath.Join(dir, "index"))) // so OpenDir scans
				path = filepath.Join(dir, persist.FileName("big", "checkout:big"))
				require.NoError(t, os.WriteFile(path, []byte(`{"version":1}`), 0o600))
			} else {
				path = filepath.Join(dir, "index")
			}
			require.NoError(t, os.Truncate(path, huge))

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestOpenDirSurvivesHugeSparseFile$", "-test.count=1")
			cmd.Env = append(os.Environ(), rtChildEnv+"="+dir)
			out, err := cmd.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("LISTED:")) {
				first := out
				if i := bytes.IndexByte(first, '\n'); i >= 0 && i < 300 {
					first = first[:i]
				} else if len(first) > 300 {
					first = first[:300]
				}
				var ee *exec.ExitError
				errors.As(err, &ee)
				t.Fatalf("the %s file made 1 TB (sparse) in the store killed the process opening it (%v): %s", which, err, first)
			}
		})
	}
}
