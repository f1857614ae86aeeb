package sim

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/long"
)

// The simulation's budgets and replay, all from the environment. Both
// modes read them.
//
//	IDEM_SIM_SEED=n     run only seed n (the replay of a failure)
//	IDEM_SIM_SEEDS=n    run n seeds, from IDEM_SIM_FIRST_SEED (default 1); by default
//	                    80 virtual, 2 real (12 with IDEM_LONG=1, 8 with it under -race)
//	IDEM_SIM_ACTIONS=n  user actions per seed (default 300 virtual, 200 real)
//	IDEM_SIM_DURATION=d keep running seeds for d (a Go duration), after the seeds above
//	IDEM_SIM_FAULTS=... fault classes to turn on or off, as in ParseFaults ("all", "-net.hold", ...)
//	IDEM_SIM_VERBOSE=1  log every seed's figures
//	IDEM_SIM_KEEP_GOING=1 run every seed even after one broke the invariants, and count them
//	IDEM_SIM_TRACE=1    log everything that happens (virtual; use with IDEM_SIM_SEED)
//	IDEM_SIM_STORE=file|memory the device store (real; default file)
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

// replayCommand is the one line that reruns seed in the subtest sub.
func replayCommand(sub string, seed uint64, actions int) string {
	var env []string
	env = append(env, fmt.Sprintf("IDEM_SIM_SEED=%d", seed), fmt.Sprintf("IDEM_SIM_ACTIONS=%d", actions))
	for _, name := range []string{"IDEM_SIM_FAULTS", "IDEM_SIM_STORE"} {
		if v := os.Getenv(name); v != "" {
			env = append(env, fmt.Sprintf("%s=%q", name, v))
		}
	}
	return strings.Join(env, " ") + fmt.Sprintf(" go test ./internal/sim -run 'TestSimulation$/^%s$' -count=1 -v", sub)
}

// TestSimulation runs the world for a bounded number of seeds, in each
// mode, and fails with the seed and the command that replays it at the
// first seed whose run breaks an invariant. The virtual mode replays a
// seed exactly. The real parts redraw a seed's faults for the same
// intents, under the Go scheduler's interleaving.
func TestSimulation(t *testing.T) {
	t.Run("virtual", func(t *testing.T) {
		var every []faultClass
		for f := range numFaults {
			every = append(every, f)
		}
		simulate(t, "virtual", 80, 300, every, func(cfg *config) {
			cfg.Mode = virtual
			if os.Getenv("IDEM_SIM_TRACE") != "" {
				cfg.Trace = func(line string) { t.Log(line) }
			}
		})
	})
	t.Run("real parts", func(t *testing.T) {
		// CI runs it with and without the race detector: under a minute in all.
		// Eight seeds inject every class the real mode has, the rarest
		// about five times; the long runs check that they do. Two keep
		// a plain go test short, and are too few for that check.
		seeds, classes := uint64(2), []faultClass(nil)
		switch {
		case long.Enabled() && raceEnabled:
			seeds, classes = 8, realClasses
		case long.Enabled():
			seeds, classes = 12, realClasses
		}
		store := os.Getenv("IDEM_SIM_STORE")
		if store != "" && store != "file" && store != "memory" {
			t.Fatalf("IDEM_SIM_STORE=%q: want file or memory", store)
		}
		simulate(t, "real parts", seeds, 200, classes, func(cfg *config) {
			cfg.Mode = real
			if store != "memory" {
				cfg.Dir = t.TempDir()
			}
		})
	})
}

// simulate runs the seeds the environment names, by default seeds of
// them with actions each, setting each run's config with set. It checks
// that every class of classes that is on was injected.
func simulate(t *testing.T, sub string, defSeeds uint64, defActions int, classes []faultClass, set func(*config)) {
	faults := simFaults(t)
	actions := int(envUint(t, "IDEM_SIM_ACTIONS", uint64(defActions)))
	var seeds []uint64
	if v := os.Getenv("IDEM_SIM_SEED"); v != "" {
		seeds = []uint64{envUint(t, "IDEM_SIM_SEED", 0)}
	} else {
		first := envUint(t, "IDEM_SIM_FIRST_SEED", 1)
		for i := range envUint(t, "IDEM_SIM_SEEDS", defSeeds) {
			seeds = append(seeds, first+i)
		}
	}
	if len(seeds) == 0 {
		t.Fatal("IDEM_SIM_SEEDS=0: no seed to run")
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
	t.Logf("fault classes on: %s", faults)

	var total stats
	n := 0
	start := time.Now()
	run := func(seed uint64) bool {
		cfg := config{Seed: seed, Actions: actions, Faults: faults}
		set(&cfg)
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
			t.Errorf("seed %d broke the invariants; replay it with:\n\t%s", seed, replayCommand(sub, seed, actions))
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
		for _, f := range classes {
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
