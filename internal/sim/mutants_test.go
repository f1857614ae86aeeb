package sim

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A mutant is a one-line change to idem, its server middleware or its
// store, compiled only with the idem_mutant build tag and switched on with
// IDEM_MUTANT=<name>. Each reverts a rule that keeps "never twice" true;
// the simulation, in its default budget, must catch every one.
type mutant struct {
	name string
	// where the one-line change is
	where string
	// pkg and run are the test that must catch it.
	pkg, run string
}

var mutants = []mutant{
	{"server-lookup-before-insert", "idempotency/middleware.go: a lookup's \"absent\" is trusted over Insert's conflict", "./internal/sim", "^TestSimulation$"},
	// The file store's power-cut test catches this one: the simulation's
	// devices keep their intents in persist.Memory.
	{"dir-not-synced-after-rename", "persist/file.go: Save returns before the directory sync that makes its rename durable", "./persist", "^TestPowerCut$"},
	{"reconcile-delay-from-creation", "reconcile.go: a 404 is trusted once the intent is older than the reconcile delay, whenever its last attempt left", "./internal/sim", "^TestSimulation$"},
	{"5xx-final", "retry.go: a 5xx above 504 (a proxy's 520-524) is a final answer", "./internal/sim", "^TestSimulation$"},
	{"latest-by-wall-clock", "intent.go: an action's latest intent is the one created last by the device's clock", "./internal/sim", "^TestSimulation$"},
	{"key-spelling-from-option", "adapter.go: the key is spelled as the current Client's option says, not as stored", "./internal/sim", "^TestSimulation$"},
	{"redirect-answer-is-outcome", "adapter.go: a 301/302/303 after a POST is followed and the GET's answer taken for the outcome", "./internal/sim", "^TestSimulation$"},
	// idem never sends two bodies under one key, so the simulated world
	// cannot reach the fingerprint's rules on member names: the
	// fingerprint's own test of them catches this one.
	{"fingerprint-ignores-member-case", "idempotency/fingerprint.go: member names are compared as spelled, not folded as encoding/json folds them", "./idempotency", "^TestFingerprintNeverSharedByBodiesReadDifferently$"},
}

// TestMutantsAreKilled builds the tests with the idem_mutant tag and runs
// the simulation once per mutant: each run must fail, and a run with no
// mutant must pass, so that the failures are the mutants' doing.
func TestMutantsAreKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the simulation once per mutant")
	}
	if mutantBuild {
		t.Skip("already a mutant build")
	}
	if raceEnabled {
		// The mutants run in builds without the detector; CI runs this
		// test in its plain go test ./... step.
		t.Skip("the race detector adds nothing to the mutants' runs")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build the mutants: %v", err)
	}
	dir := t.TempDir()
	binaries := make(map[string]string)
	build := func(pkg string) string {
		if bin, ok := binaries[pkg]; ok {
			return bin
		}
		bin := filepath.Join(dir, strings.NewReplacer("/", "_", ".", "_").Replace(pkg)+".test")
		root := moduleRoot(t)
		cmd := exec.Command(gobin, "test", "-c", "-tags", "idem_mutant", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s with the idem_mutant tag: %v\n%s", pkg, err, out)
		}
		binaries[pkg] = bin
		return bin
	}
	run := func(t *testing.T, m mutant, name string) (string, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, build(m.pkg), "-test.run", m.run, "-test.count=1")
		cmd.Dir = filepath.Join(moduleRoot(t), m.pkg)
		cmd.Env = append(os.Environ(), "IDEM_MUTANT="+name)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ctx.Err() != nil {
			t.Fatalf("%s with IDEM_MUTANT=%q did not finish: %s", m.pkg, name, out.String())
		}
		return out.String(), err == nil
	}

	controlled := make(map[string]bool)
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			if !controlled[m.pkg+" "+m.run] {
				if out, ok := run(t, m, ""); !ok {
					t.Fatalf("the idem_mutant build fails with no mutant on; the mutant's verdict would mean nothing:\n%s", out)
				}
				controlled[m.pkg+" "+m.run] = true
			}
			out, ok := run(t, m, m.name)
			if ok {
				t.Fatalf("mutant %s (%s) survived %s %s", m.name, m.where, m.pkg, m.run)
			}
			if !strings.Contains(out, "replay it with") && !strings.Contains(out, "--- FAIL") {
				t.Fatalf("mutant %s: the run failed, but not on an invariant:\n%s", m.name, out)
			}
			t.Logf("killed: %s", firstLine(out, "seed "))
		})
	}
}

func firstLine(out, prefix string) string {
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, prefix); i >= 0 {
			return strings.TrimSpace(line[i:])
		}
	}
	return ""
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
