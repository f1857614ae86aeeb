package sim

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The simulation's budgets and replay, all from the environment:
//
//	IDEM_SIM_SEED=n     run only seed n (the replay of a failure)
//	IDEM_SIM_SEEDS=n    run n seeds (default 80), from IDEM_SIM_FIRST_SEED (default 1)
//	IDEM_SIM_ACTIONS=n  user actions per seed (default 300)
//	IDEM_SIM_DURATION=d keep running seeds for d (a Go duration), after the seeds above
//	IDEM_SIM_FAULTS=... fault classes to turn on or off, as in ParseFaults ("all", "-net.hold", ...)
//	IDEM_SIM_VERBOSE=1  log every seed's figures
//	IDEM_SIM_KEEP_GOING=1 run every seed even after one broke the invariants, and count them
//	IDEM_SIM_TRACE=1    log everything that happens (use with IDEM_SIM_SEED)
func envUint(t *testing.T, name string, def uint64) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// simFaults is the default fault set with IDEM_SIM_FAULTS applied.
func simFaults(t *testing.T) faultSet {
	t.Helper()
	fs, err := parseFaults(defaultFaults(), os.Getenv("IDEM_SIM_FAULTS"))
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// replayCommand is the one line that reruns seed.
func replayCommand(seed uint64, actions int) string {
	var env []string
	env = append(env, fmt.Sprintf("IDEM_SIM_SEED=%d", seed), fmt.Sprintf("IDEM_SIM_ACTIONS=%d", actions))
	if f := os.Getenv("IDEM_SIM_FAULTS"); f != "" {
		env = append(env, fmt.Sprintf("IDEM_SIM_FAULTS=%q", f))
	}
	return strings.Join(env, " ") + " go test ./internal/sim -run 'TestSimulation$' -count=1 -v"
}

// TestSimulation runs the world for a bounded number of seeds and fails
// with the seed and the command that replays it at the first seed whose
// run breaks an invariant.
func TestSimulation(t *testing.T) {
	faults := simFaults(t)
	actions := int(envUint(t, "IDEM_SIM_ACTIONS", 300))
	var seeds []uint64
	if v := os.Getenv("IDEM_SIM_SEED"); v != "" {
		seeds = []uint64{envUint(t, "IDEM_SIM_SEED", 0)}
	} else {
		first := envUint(t, "IDEM_SIM_FIRST_SEED", 1)
		for i := range envUint(t, "IDEM_SIM_SEEDS", 80) {
			seeds = append(seeds, first+i)
		}
	}
	var until time.Time
	if v := os.Getenv("IDEM_SIM_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("IDEM_SIM_DURATION=%q: %v", v, err)
		}
		until = time.Now().Add(d)
	}
	verbose := os.Getenv("IDEM_SIM_VERBOSE") != ""
	keepGoing := os.Getenv("IDEM_SIM_KEEP_GOING") != ""
	var failed []uint64
	violations := 0
	trace := os.Getenv("IDEM_SIM_TRACE") != ""
	t.Logf("fault classes on: %s", faults)

	var total stats
	n := 0
	start := time.Now()
	run := func(seed uint64) bool {
		cfg := config{Seed: seed, Actions: actions, Faults: faults}
		if trace {
			cfg.Trace = func(line string) { t.Log(line) }
		}
		res := run(cfg)
		total.Add(res.Stats)
		n++
		if verbose {
			t.Logf("seed %d: %d actions, %d intents, %d charges, settled in %s", seed, res.Stats.Actions, res.Stats.Intents, res.Stats.Charges, res.Stats.Settle)
		}
		if len(res.Violations) > 0 {
			for _, v := range res.Violations {
				t.Errorf("seed %d: %s", seed, v)
			}
			t.Errorf("seed %d broke the invariants; replay it with:\n\t%s", seed, replayCommand(seed, actions))
			failed = append(failed, seed)
			violations += len(res.Violations)
			return keepGoing
		}
		return true
	}
	ok := true
	for _, seed := range seeds {
		if ok = run(seed); !ok {
			break
		}
	}
	for seed := seeds[len(seeds)-1] + 1; ok && time.Now().Before(until); seed++ {
		ok = run(seed)
	}
	if (len(seeds) > 1 || !until.IsZero()) && len(failed) == 0 {
		// Every class that is on was injected: a world that silently lost
		// one would pass for the wrong reason.
		for f := range numFaults {
			if !faults[f] {
				continue
			}
			injected := 0
			for kind, c := range total.Faults {
				if kind == f.Name() || strings.HasPrefix(kind, f.Name()+" ") {
					injected += c
				}
			}
			if injected == 0 {
				t.Errorf("fault class %s is on but was never injected in %d seed(s)", f.Name(), n)
			}
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d seed(s), %d user actions, %d sessions, %d intents, %d attempts, %d charges in %s (%.0f actions/s); longest settle after calm: %s",
		n, total.Actions, total.Sessions, total.Intents, total.Attempts, total.Charges, elapsed.Round(time.Millisecond),
		float64(total.Actions)/elapsed.Seconds(), total.Settle)
	t.Logf("violations: %d, in %d seed(s) %v", violations, len(failed), failed)
	t.Logf("faults injected:\n\t%s", strings.Join(countLines(total.Faults), "\n\t"))
	t.Logf("server outcomes:\n\t%s", strings.Join(countLines(total.Outcomes), "\n\t"))
}
