package idem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// The real process crash test: cmd/fakeserver runs as its own process, and
// a client process (this test binary, re-run in child mode) pays intents
// through idem with a FileStore and is killed with SIGKILL at random
// moments, then started again on the same state directory, until every
// intent is resolved. IDEM_CRASH_ROUNDS sets the number of kills (default
// 10); IDEM_SIM_SEED the seed (default 1), as for the randomized tests.

const (
	crashChildEnv  = "IDEM_CRASH_CHILD"
	crashMarker    = "crash: "
	crashDeclineAt = 7 // every 7th intent's card is declined
)

// TestCrashHelperProcess is the client process of TestProcessCrashes; it
// does nothing in a normal run.
func TestCrashHelperProcess(t *testing.T) {
	if os.Getenv(crashChildEnv) != "1" {
		t.Skip("helper process of TestProcessCrashes")
	}
	n, err := strconv.Atoi(os.Getenv("IDEM_CRASH_INTENTS"))
	if err != nil {
		fmt.Fprintf(os.Stdout, crashMarker+"error IDEM_CRASH_INTENTS: %v\n", err)
		os.Exit(1)
	}
	os.Exit(crashChild(os.Getenv("IDEM_CRASH_STATE"), os.Getenv("IDEM_CRASH_URL"), n))
}

// crashChild pays the intents and prints a marker at each point a kill is
// aimed at. Each marker is followed by a short pause, so that a kill sent
// on seeing it lands in the window it names.
func crashChild(stateDir, baseURL string, intents int) int {
	mark := func(format string, a ...any) {
		fmt.Fprintf(os.Stdout, crashMarker+format+"\n", a...)
		time.Sleep(2 * time.Millisecond) // the crash window
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stdout, crashMarker+"error %v\n", err)
		return 1
	}
	store, err := persist.OpenDir(stateDir, nil)
	if err != nil {
		return fail(err)
	}
	defer store.Close()
	tr := &http.Transport{DisableKeepAlives: true}
	c, err := idem.NewWith(
		idem.WithStore(store),
		idem.WithHTTPClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 50, InitialInterval: 5 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxRetryAfter: 3 * time.Second}),
		idem.WithAttemptHook(func(a idem.Attempt) {
			if a.StatusCode != 0 && !a.Retry {
				// The answer is in, and the outcome is not saved yet.
				mark("answer %s %d", a.Key, a.StatusCode)
			}
		}),
	)
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	for i := range intents {
		in, err := c.Intent(ctx, fmt.Sprintf("crash:%d", i), crashRequest(baseURL, i))
		if err != nil {
			return fail(err)
		}
		if err := idem.Arm(c, ctx, in); err != nil {
			return fail(err)
		}
		mark("saved %s", in.Key())
		if in.State().Resolved() {
			continue
		}
		mark("sent %s", in.Key())
		resp, err := c.Do(ctx, in)
		if err != nil && !isAPIError(err) {
			return fail(err)
		}
		mark("resolved %s %d", in.Key(), resp.StatusCode)
	}
	fmt.Fprintln(os.Stdout, crashMarker+"done")
	return 0
}

func crashRequest(baseURL string, i int) idem.Request {
	customer := "cus_crash"
	if i%crashDeclineAt == crashDeclineAt-1 {
		customer = "cus_declined"
	}
	req, err := idem.JSONRequest(http.MethodPost, baseURL+"/payments", map[string]any{
		"amount": 100 + i, "currency": "AZN", "customer": customer, "description": "crash " + strconv.Itoa(i),
	})
	if err != nil {
		panic(err)
	}
	return req
}

// startFakeServerProcess builds cmd/fakeserver, starts it on a free
// loopback port and returns its base URL; the process is killed at cleanup.
func startFakeServerProcess(t *testing.T, args ...string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build cmd/fakeserver")
	}
	bin := filepath.Join(t.TempDir(), "fakeserver")
	out, err := exec.Command(goTool, "build", "-o", bin, "github.com/idemkit/idem/cmd/fakeserver").CombinedOutput()
	require.NoError(t, err, "building cmd/fakeserver: %s", out)

	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	waited := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
	})
	addr := make(chan string, 1)
	go func() {
		defer close(waited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			// The first line is "... msg=listening addr=HOST:PORT".
			line := sc.Text()
			if i := strings.Index(line, "listening addr="); i >= 0 && len(addr) == 0 {
				addr <- strings.Fields(line[i+len("listening addr="):])[0]
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case a := <-addr:
		return "http://" + a
	case <-time.After(20 * time.Second):
		t.Fatal("cmd/fakeserver did not say where it listens")
		return ""
	}
}

// child is one run of the client process.
type child struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

func startChild(t *testing.T, stateDir, baseURL string, intents int) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashHelperProcess$", "-test.count", "1")
	cmd.Env = append(os.Environ(), crashChildEnv+"=1", "IDEM_CRASH_STATE="+stateDir, "IDEM_CRASH_URL="+baseURL, "IDEM_CRASH_INTENTS="+strconv.Itoa(intents))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), crashMarker); ok {
				c.lines <- line
			}
		}
		close(c.lines)
		_ = cmd.Wait()
	}()
	return c
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill() // SIGKILL on Unix
	for range c.lines {
	}
	<-c.done
}

func TestProcessCrashes(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" || runtime.GOOS == "js" || runtime.GOOS == "wasip1" {
		t.Skip("needs SIGKILL and subprocesses")
	}
	if os.Getenv(crashChildEnv) == "1" {
		t.Skip("in the helper process")
	}
	t.Parallel()
	seed := pickSeeds(t, 1)[0]
	rounds := envInt(t, "IDEM_CRASH_ROUNDS", 10)
	// Enough intents that the kills, each a few intents apart, do not run
	// out of work before the rounds do.
	intents := 4 + 2*rounds
	t.Logf("seed %d, %d rounds, %d intents (IDEM_SIM_SEED, IDEM_CRASH_ROUNDS)", seed, rounds, intents)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d", seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 0xc4a5))

	// A processing delay widens the "during the request" window; the lease
	// outlives it so no takeover races a live worker.
	baseURL := startFakeServerProcess(t, "-processing-delay", "15ms", "-lease", "2s", "-sweep-every", "0")
	stateDir := filepath.Join(t.TempDir(), "state")

	kills := map[string]int{}
	// What the client said before each kill: the intents whose Intent
	// returned (saved durably), and those whose Do returned, with the
	// status (their outcome saved, its directory sync perhaps not done).
	saved := map[string]bool{}
	resolved := map[string]string{}
	started := 0
	finished := false
	for round := 0; round < rounds && !finished; round++ {
		c := startChild(t, stateDir, baseURL, intents)
		started++
		// The kill point: the n-th marker of a kind, or a random moment.
		kinds := []string{"saved", "sent", "answer", "resolved", "time"}
		kind := kinds[rng.IntN(len(kinds))]
		nth := rng.IntN(4)
		var timer <-chan time.Time
		if kind == "time" {
			timer = time.After(time.Duration(rng.IntN(60)) * time.Millisecond)
		}
		seen := 0
		deadline := time.After(30 * time.Second)
	watch:
		for {
			select {
			case line, ok := <-c.lines:
				if !ok {
					break watch
				}
				if strings.HasPrefix(line, "error") {
					c.kill()
					t.Fatalf("round %d: the client failed: %s", round, line)
				}
				if line == "done" {
					finished = true
					break watch
				}
				switch f := strings.Fields(line); f[0] {
				case "saved":
					saved[f[1]] = true
				case "resolved":
					resolved[f[1]] = f[2]
				}
				if strings.HasPrefix(line, kind+" ") {
					if seen == nth {
						c.kill()
						kills[kind]++
						break watch
					}
					seen++
				}
			case <-timer:
				c.kill()
				kills[kind]++
				break watch
			case <-deadline:
				c.kill()
				t.Fatalf("round %d: the client made no progress in 30s", round)
			}
		}
		c.kill()
		checkAfterKill(t, stateDir, saved, resolved)
	}
	// A last run, not killed, finishes what is left.
	if !finished {
		c := startChild(t, stateDir, baseURL, intents)
		started++
		deadline := time.After(60 * time.Second)
	last:
		for {
			select {
			case line, ok := <-c.lines:
				require.True(t, ok, "the last client run ended without finishing")
				require.False(t, strings.HasPrefix(line, "error"), line)
				if line == "done" {
					break last
				}
			case <-deadline:
				c.kill()
				t.Fatal("the last client run did not finish in 60s")
			}
		}
		c.kill()
	}
	t.Logf("%d client processes started; SIGKILLs by point: %v", started, kills)

	// The device: one intent per action, each resolved.
	store, err := persist.OpenDir(stateDir, nil)
	require.NoError(t, err)
	defer store.Close()
	recs, err := store.List(context.Background(), persist.Filter{})
	require.NoError(t, err)
	require.Len(t, recs, intents, "one intent per action: a second key would be a second payment")

	// The server: exactly one charge per intent whose card was not declined.
	paid, declined := 0, 0
	ids := map[string]bool{}
	for _, r := range recs {
		require.True(t, r.State.Resolved(), "intent %s is %s", r.Key, r.State)
		require.NotNil(t, r.Response)
		status, body := getURL(t, lookupOf(r.URL, r.Key))
		switch r.State {
		case persist.StateSucceeded:
			paid++
			require.Equal(t, http.StatusOK, status, "intent %s succeeded but the server has no payment", r.Key)
			id := paymentID(t, body)
			assert.Equal(t, id, paymentID(t, r.Response.Body), "the device keeps the server's payment")
			assert.False(t, ids[id], "payment %s for two intents", id)
			ids[id] = true
		case persist.StateFailed:
			declined++
			assert.Equal(t, http.StatusPaymentRequired, r.Response.StatusCode)
			assert.Equal(t, http.StatusNotFound, status)
		default:
			t.Errorf("intent %s ended %s", r.Key, r.State)
		}
	}
	assert.Equal(t, intents/crashDeclineAt, declined)
	var stats struct {
		Payments        int `json:"payments"`
		ProviderCharges int `json:"provider_charges"`
		InProgress      int `json:"in_progress"`
		Requests        int `json:"requests"`
		Executions      int `json:"executions"`
	}
	status, body := getURL(t, baseURL+"/_fake/stats")
	require.Equal(t, http.StatusOK, status)
	require.NoError(t, json.Unmarshal(body, &stats))
	assert.Equal(t, paid, stats.Payments, "payments at the server")
	assert.Equal(t, paid, stats.ProviderCharges, "charges at the provider")
	assert.Zero(t, stats.InProgress)
	t.Logf("%d intents: %d paid, %d declined; server: %d requests, %d executions", len(recs), paid, declined, stats.Requests, stats.Executions)
}

// checkAfterKill checks, after a SIGKILL, that every intent whose Intent
// returned is stored, and every one whose Do returned is stored resolved
// with the answer Do returned: a kill, even before the directory sync of
// the outcome, loses neither.
func checkAfterKill(t *testing.T, stateDir string, saved map[string]bool, resolved map[string]string) {
	t.Helper()
	store, err := persist.OpenDir(stateDir, nil)
	require.NoError(t, err)
	defer store.Close()
	ctx := context.Background()
	for key := range saved {
		_, err := store.Get(ctx, key)
		require.NoError(t, err, "intent %s was saved before the kill", key)
	}
	for key, status := range resolved {
		rec, err := store.Get(ctx, key)
		require.NoError(t, err)
		require.True(t, rec.State.Resolved(), "intent %s: Do returned %s before the kill, but it is stored %s", key, status, rec.State)
		require.Equal(t, status, strconv.Itoa(rec.Response.StatusCode), "intent %s", key)
	}
}

func getURL(t *testing.T, u string) (int, []byte) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, body
}

// relEpoch is where the manual clocks of the crash and cut tests start.
var relEpoch = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s=%q", name, v)
	return n
}

func envSeed(t testing.TB, name string, def uint64) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	require.NoError(t, err, "%s=%q", name, v)
	return n
}

// pickSeeds returns the seeds of a randomized test: IDEM_SIM_SEED alone,
// or IDEM_SIM_SEEDS of them (def by default) from IDEM_SIM_FIRST_SEED, as
// internal/sim takes them.
func pickSeeds(t testing.TB, def uint64) []uint64 {
	t.Helper()
	if os.Getenv("IDEM_SIM_SEED") != "" {
		return []uint64{envSeed(t, "IDEM_SIM_SEED", 0)}
	}
	first := envSeed(t, "IDEM_SIM_FIRST_SEED", 1)
	var seeds []uint64
	for i := range envSeed(t, "IDEM_SIM_SEEDS", def) {
		seeds = append(seeds, first+i)
	}
	require.NotEmpty(t, seeds, "IDEM_SIM_SEEDS")
	return seeds
}

func isAPIError(err error) bool {
	var apiErr *idem.APIError
	return errors.As(err, &apiErr)
}

// paymentID returns the id of a payment body.
func paymentID(t testing.TB, body []byte) string {
	t.Helper()
	var p struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(body, &p), "body %s", body)
	require.NotEmpty(t, p.ID, "body %s", body)
	return p.ID
}
