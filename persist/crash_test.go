package persist_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
)

// The crash test runs the test binary again as a child (TestCrashChild) that
// saves intents from several goroutines in tight loops and reports each save
// on stdout after Save returned; the parent kills it with SIGKILL at a
// random moment, reopens the store and checks every reported save.
//
// This proves that a save that returned survives the death of the process
// at any instant, and that a save cut short is never visible half-written.
// It does not prove survival of a power loss: the kernel's page cache
// outlives a killed process. TestPowerCut covers power loss, on a file
// system that forgets what was not synced.
const (
	crashDirEnv    = "IDEM_CRASH_CHILD_DIR"
	crashRoundEnv  = "IDEM_CRASH_CHILD_ROUND"
	crashRoundsEnv = "IDEM_CRASH_ROUNDS" // rounds to run; default 20, 5 with -short
	crashWorkers   = 8                   // goroutines saving at once in the child
)

// crashBody is the request body saved for key: a deterministic function of
// the key, of a size that varies from key to key (a few hundred bytes to a
// few kilobytes), so that a torn write shows as a mismatch.
func crashBody(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	chunk := hex.EncodeToString(sum[:])
	n := 4 + int(sum[0])%100
	return []byte(strings.Repeat(chunk, n))
}

func crashRecord(key string, created time.Time) *persist.Record {
	return &persist.Record{
		Key: key, Method: "POST", URL: "https://api.example.com/v1/payments",
		Body: crashBody(key), Fingerprint: key, CreatedAt: created, UpdatedAt: created,
		State: persist.StateNew,
	}
}

// TestCrashChild is the child of TestCrash; it does nothing unless run by
// it. Each of crashWorkers goroutines saves a new intent, reports "new
// KEY", saves it again resolved (replacing the file) and reports "done
// KEY", in a loop until killed; concurrent saves share their syncs.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("run by TestCrash as its child")
	}
	round := os.Getenv(crashRoundEnv)
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	ctx := context.Background()
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	report := func(what, key string) error {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%s %s\n", what, key)
		return out.Flush() // one write(2) per line, after the save returned
	}
	errs := make(chan error, crashWorkers)
	for w := range crashWorkers {
		go func() {
			// A child whose parent died stops by itself.
			for i := range 20_000 {
				key := fmt.Sprintf("r%s-%d%05d", round, w, i)
				now := time.Now()
				r := crashRecord(key, now)
				r.Rev = persist.NewRev()
				err := s.Write(ctx, r, nil)
				if err == nil {
					err = report("new", key)
				}
				done := r.Clone()
				done.State, done.Rev = persist.StateSucceeded, persist.NewRev()
				done.UpdatedAt = now.Add(time.Millisecond)
				done.Response = &persist.Response{StatusCode: 201, Body: crashBody("response " + key)}
				if err == nil {
					err = s.Write(ctx, done, r)
				}
				if err == nil {
					err = report("done", key)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range crashWorkers {
		require.NoError(t, <-errs)
	}
}

func TestCrash(t *testing.T) {
	if os.Getenv(crashDirEnv) != "" {
		t.Skip("this is the child")
	}
	t.Parallel()
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	if v := os.Getenv(crashRoundsEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "%s=%q", crashRoundsEnv, v)
		rounds = n
	}
	dir := newDir(t) // shared by all rounds, so that each reopens the debris of the last
	total := 0
	for round := range rounds {
		total += crashRound(t, dir, round)
		if t.Failed() {
			break
		}
	}
	t.Logf("%d rounds, %d reported saves checked", rounds, total)
}

// crashRound runs and kills one child, checks the store, and returns how
// many saves the child reported.
func crashRound(t *testing.T, dir string, round int) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashRoundEnv+"="+strconv.Itoa(round))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout) // gives a last line without its newline too
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var reported []string
	first, ok := <-lines
	require.True(t, ok, "round %d: the child exited before its first save", round)
	reported = append(reported, first)

	// While the child holds the store, another process cannot open it.
	_, err = persist.OpenDir(dir, nil)
	assert.ErrorIs(t, err, persist.ErrLocked, "round %d: opening the child's store", round)

	time.Sleep(time.Duration(rand.Int64N(int64(40 * time.Millisecond))))
	require.NoError(t, cmd.Process.Kill()) // SIGKILL on Unix
	for l := range lines {
		reported = append(reported, l)
	}
	_ = cmd.Wait() // "signal: killed"

	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err, "round %d: reopening after the kill", round)
	defer func() { assert.NoError(t, s.Close()) }()
	ctx := context.Background()
	recs, err := s.List(ctx, persist.Filter{})
	require.NoError(t, err, "round %d: no half-written record is visible", round)
	for _, r := range recs {
		assert.Equal(t, crashBody(r.Key), r.Body, "round %d: body of %s", round, r.Key)
	}

	// A last line without its newline was cut by the kill: a save that
	// returned, or the report of one; either way it need not be checked.
	checked := 0
	for _, l := range reported {
		what, key, ok := strings.Cut(l, " ")
		if !ok || !strings.HasPrefix(key, fmt.Sprintf("r%d-", round)) || len(key) != len(fmt.Sprintf("r%d-000000", round)) {
			continue
		}
		checked++
		r, err := s.Get(ctx, key)
		if !assert.NoError(t, err, "round %d: reported %q", round, l) {
			continue
		}
		assert.Equal(t, crashBody(key), r.Body, "round %d: body of %s", round, key)
		switch what {
		case "new":
			assert.Contains(t, []persist.State{persist.StateNew, persist.StateSucceeded}, r.State, key)
		case "done":
			assert.Equal(t, persist.StateSucceeded, r.State, key)
			if assert.NotNil(t, r.Response, key) {
				assert.Equal(t, crashBody("response "+key), r.Response.Body, key)
			}
		default:
			t.Errorf("round %d: unexpected line %q", round, l)
		}
	}
	for _, name := range dirNames(t, dir) {
		assert.False(t, strings.HasPrefix(name, ".tmp-"), "round %d: temporary file %s left after reopening", round, name)
	}
	return checked
}
