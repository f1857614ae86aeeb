// Package mutant applies mutants to idem's code and requires its tests to
// kill every one.
//
// A mutant is a small change that reverts one rule idem keeps: a row that
// names a file, a string of its code (the anchor, which must occur exactly
// once) and the code to put in its place, with the test that must fail once
// the change is made. The production code carries no trace of it: Test
// writes the changed copy of the file to a temporary directory and builds
// the test with `go test -overlay`, so no build tag, constant or environment
// variable in idem switches a mutant on.
//
// The rows live beside the test that kills them, in a table that the
// package's TestMutants passes to Test:
//
//	func TestMutants(t *testing.T) {
//		mutant.Test(t, []mutant.Mutant{{
//			Name: "5xx-final", File: "retry.go",
//			Anchor:  "code >= 500:",
//			Replace: "code >= 500 && code <= 504:",
//			Pkg:     "./internal/sim", Run: "^TestSimulation$",
//			Note:    "a proxy's 520-524 is taken for a final answer",
//		}})
//	}
//
// A row whose anchor no longer occurs exactly once fails the test at once,
// naming the row and the count: a mutant that silently stopped applying
// would be a test that cannot fail. So does a mutant that does not compile,
// one that survives (its run passes), one whose run does not finish within
// its bound, and a row whose test fails or runs nothing without the mutant.
//
// The runs see the test's environment without the seeds and budgets of the
// randomized tests (IDEM_SIM_*), and with the row's Env.
//
// Test runs only with IDEM_LONG=1, which CI sets. It is skipped under
// -short and under the race detector (the mutants' builds have no
// detector, and the verdicts would not change).
package mutant

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/long"
)

// Mutant is one row: a change to one file of the module and the test that
// must kill it.
type Mutant struct {
	// Name names the mutant and its subtest: short, unique, in kebab case.
	Name string
	// File is the file to change, relative to the module root, with
	// slashes ("retry.go", "idempotency/middleware.go").
	File string
	// Anchor is a string of File's code that must occur exactly once in it;
	// Replace takes its place.
	Anchor, Replace string
	// Pkg is the package whose tests must kill the mutant, relative to the
	// module root ("./internal/sim", "." for the root); Run is the
	// -run pattern that selects the killing test.
	Pkg, Run string
	// Env is added to the environment of the test's runs, mutated or not
	// ("IDEM_SIM_SEEDS=40").
	Env []string
	// Note says what rule the mutant reverts.
	Note string
}

// RunTimeout bounds one run of a test, mutated or not. A mutant must be
// killed quickly: the simulation stops at the first seed that breaks an
// invariant.
const RunTimeout = 2 * time.Minute

// childEnv is set in the environment of every run the harness starts, to
// the mutant's name ("" for the unmutated run): a run never applies
// mutants of its own, whatever its -run pattern matches.
const childEnv = "IDEM_MUTANT_RUN"

// Test checks every row's anchor, then builds and runs the test of each
// mutant in a subtest named for it: each mutated run must fail, and the
// same test without any mutant must pass. A subtest logs the test and the
// seed that killed its mutant.
func Test(t *testing.T, rows []Mutant) {
	t.Helper()
	if _, child := os.LookupEnv(childEnv); child {
		t.Skip("a mutant's run applies no mutants")
	}
	if testing.Short() {
		t.Skip("builds and runs a test once per mutant")
	}
	long.Skip(t, "builds and runs a test once per mutant")
	if raceEnabled {
		t.Skip("the mutants run in builds without the race detector; go test without -race runs them")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if errs := Check(root, rows); len(errs) > 0 {
		for _, err := range errs {
			t.Error(err)
		}
		t.FailNow()
	}
	r, err := newRunner(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	t.Cleanup(func() {
		t.Logf("%d mutant(s) in %s (%d build(s), %d run(s), %d at a time)",
			len(rows), time.Since(start).Round(100*time.Millisecond), r.builds.Load(), r.runs.Load(), cap(r.sem))
	})
	for _, m := range rows {
		t.Run(m.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if d, ok := t.Deadline(); ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
				defer cancel()
			}
			if m.Note != "" {
				t.Logf("%s: %s", m.File, m.Note)
			}
			killedBy, err := r.verdict(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("killed by %s", killedBy)
		})
	}
}

// Check returns an error for each row that cannot be applied as written:
// a name missing or used twice, a missing file, an anchor that does not
// occur exactly once, a replacement equal to the anchor, no test to run.
func Check(root string, rows []Mutant) []error {
	var errs []error
	bad := func(m Mutant, format string, args ...any) {
		errs = append(errs, fmt.Errorf("mutant %q (%s): %s", m.Name, m.File, fmt.Sprintf(format, args...)))
	}
	names := make(map[string]bool)
	for _, m := range rows {
		switch {
		case m.Name == "":
			bad(m, "no name")
		case names[m.Name]:
			bad(m, "the name is used by another row")
		case strings.ContainsAny(m.Name, "/ \t\n"):
			bad(m, "the name has a slash or a space")
		}
		names[m.Name] = true
		if m.Pkg == "" || m.Run == "" {
			bad(m, "no Pkg or Run: no test to kill it")
		} else if _, err := regexp.Compile(m.Run); err != nil {
			bad(m, "Run: %v", err)
		}
		if m.Anchor == "" {
			bad(m, "an empty anchor")
			continue
		}
		if m.Anchor == m.Replace {
			bad(m, "the replacement is the anchor: nothing changes")
		}
		if filepath.IsAbs(m.File) || !filepath.IsLocal(filepath.FromSlash(m.File)) {
			bad(m, "File must be relative to the module root")
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m.File)))
		if err != nil {
			bad(m, "%v", err)
			continue
		}
		if n := strings.Count(string(src), m.Anchor); n != 1 {
			bad(m, "the anchor occurs %d times in the file, not once; rewrite the row for the code as it is now:\n%s", n, m.Anchor)
		}
	}
	return errs
}

// runner builds and runs the tests of the mutants, a few at a time.
type runner struct {
	root, dir, gobin string
	sem              chan struct{}

	mu       sync.Mutex
	controls map[string]*control // by package, pattern and environment
	buildMu  sync.Mutex          // held while an unmutated build runs

	builds, runs atomic.Int64
}

// control is the unmutated run of one test, shared by its mutants.
type control struct {
	once sync.Once
	err  error
}

func newRunner(root, dir string) (*runner, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the mutants are built with the go command: %w", err)
	}
	// Two at a time at most: a build or a run of the simulation keeps a
	// core busy, and go test runs other packages meanwhile.
	return &runner{root: root, dir: dir, gobin: gobin, sem: make(chan struct{}, min(2, runtime.NumCPU())),
		controls: make(map[string]*control)}, nil
}

// verdict builds and runs m's test with m applied, after the same test
// without it passed. It returns what killed m, or why m is not shown to be
// killed.
func (r *runner) verdict(ctx context.Context, m Mutant) (string, error) {
	src, err := os.ReadFile(filepath.Join(r.root, filepath.FromSlash(m.File)))
	if err != nil {
		return "", err
	}
	if n := strings.Count(string(src), m.Anchor); n != 1 {
		return "", fmt.Errorf("mutant %q: the anchor occurs %d times in %s, not once", m.Name, n, m.File)
	}
	mutated := strings.Replace(string(src), m.Anchor, m.Replace, 1)
	built := time.Now()
	bin, out, err := r.build(ctx, m.Name, m.Pkg, map[string]string{m.File: mutated})
	building := time.Since(built)
	if err != nil {
		return "", fmt.Errorf("mutant %q does not build (rewrite its replacement): %w\n%s", m.Name, err, out)
	}
	if err := r.control(ctx, m); err != nil {
		return "", err
	}
	ran := time.Now()
	res, passed, err := r.run(ctx, bin, m, m.Name)
	running := time.Since(ran)
	switch {
	case err != nil:
		return "", fmt.Errorf("mutant %q: %w\n%s", m.Name, err, tail(res))
	case passed:
		return "", fmt.Errorf("mutant %q survived: %s -run '%s' passed with %s changed (%s)", m.Name, m.Pkg, m.Run, m.File, m.Note)
	case !strings.Contains(res, "--- FAIL: "):
		return "", fmt.Errorf("mutant %q: the run failed, but no test did:\n%s", m.Name, tail(res))
	}
	// The times include the wait for a turn (two builds or runs at once).
	return fmt.Sprintf("%s (build %s, run %s)", evidence(res), building.Round(100*time.Millisecond), running.Round(100*time.Millisecond)), nil
}

// control runs m's test without any mutant, once for all the rows that
// share it, and fails if it does not pass or runs no test: a mutant's
// failure means something only when the unmutated code passes.
func (r *runner) control(ctx context.Context, m Mutant) error {
	key := m.Pkg + "\x00" + m.Run + "\x00" + strings.Join(m.Env, "\x00")
	r.mu.Lock()
	c := r.controls[key]
	if c == nil {
		c = &control{}
		r.controls[key] = c
	}
	r.mu.Unlock()
	c.once.Do(func() {
		bin, out, err := r.build(ctx, "", m.Pkg, nil)
		if err != nil {
			c.err = fmt.Errorf("%s does not build without mutants:\n%s", m.Pkg, out)
			return
		}
		res, passed, err := r.run(ctx, bin, m, "")
		switch {
		case err != nil:
			c.err = fmt.Errorf("%s -run '%s' without mutants: %w\n%s", m.Pkg, m.Run, err, tail(res))
		case !passed:
			c.err = fmt.Errorf("%s -run '%s' fails without mutants, so its mutants' failures mean nothing:\n%s", m.Pkg, m.Run, tail(res))
		case !strings.Contains(res, "--- PASS: "):
			c.err = fmt.Errorf("%s -run '%s' runs no test:\n%s", m.Pkg, m.Run, tail(res))
		}
	})
	return c.err
}

// build compiles pkg's test binary with the files of replace (relative to
// the module root) replaced by their contents, through an overlay. The
// unmutated binary of a package (name "") is built once.
func (r *runner) build(ctx context.Context, name, pkg string, replace map[string]string) (bin string, out []byte, err error) {
	sub := "unmutated"
	if name != "" {
		sub = "mutant-" + name
	}
	dir := filepath.Join(r.dir, sub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, strings.NewReplacer("/", "_", ".", "_").Replace(pkg)+".test")
	if name == "" {
		r.buildMu.Lock()
		defer r.buildMu.Unlock() // one unmutated build at a time, each once
		if _, err := os.Stat(bin); err == nil {
			return bin, nil, nil
		}
	}
	args := []string{"test", "-c", "-vet=off", "-o", bin}
	if len(replace) > 0 {
		ov := struct{ Replace map[string]string }{Replace: make(map[string]string)}
		for file, content := range replace {
			p := filepath.Join(dir, filepath.Base(file))
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				return "", nil, err
			}
			ov.Replace[filepath.Join(r.root, filepath.FromSlash(file))] = p
		}
		js, err := json.Marshal(ov)
		if err != nil {
			return "", nil, err
		}
		overlay := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(overlay, js, 0o644); err != nil {
			return "", nil, err
		}
		args = append(args, "-overlay="+overlay)
	}
	args = append(args, pkg)
	if err := r.acquire(ctx); err != nil {
		return "", nil, err
	}
	defer r.release()
	r.builds.Add(1)
	cmd := exec.CommandContext(ctx, r.gobin, args...)
	cmd.Dir = r.root
	out, err = cmd.CombinedOutput()
	return bin, out, err
}

// run runs m's test in bin, from the package's directory as go test does.
// passed reports a clean exit; err, a run that did not finish in time.
func (r *runner) run(ctx context.Context, bin string, m Mutant, name string) (out string, passed bool, err error) {
	if err := r.acquire(ctx); err != nil {
		return "", false, err
	}
	defer r.release()
	r.runs.Add(1)
	ctx, cancel := context.WithTimeout(ctx, RunTimeout)
	defer cancel()
	args := []string{"-test.run", m.Run, "-test.count=1", "-test.v", "-test.timeout", RunTimeout.String()}
	if name != "" {
		// One failure kills the mutant. The tests after it need not run.
		args = append(args, "-test.failfast")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = filepath.Join(r.root, filepath.FromSlash(m.Pkg))
	cmd.Env = append(environ(), childEnv+"="+name)
	cmd.Env = append(cmd.Env, m.Env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	runErr := cmd.Run()
	if ctx.Err() != nil {
		return buf.String(), false, fmt.Errorf("the run did not finish in %s", time.Since(start).Round(time.Second))
	}
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		return buf.String(), false, runErr
	}
	return buf.String(), runErr == nil, nil
}

// environ is the environment of the runs: the test's, without the seeds
// and budgets of the randomized tests (IDEM_SIM_*), so that a verdict is
// the same whatever they are set to for the test itself. A row's Env sets
// them for its runs.
func environ() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "IDEM_SIM_") })
}

func (r *runner) acquire(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *runner) release() { <-r.sem }

// evidence is what killed a mutant, from its run's verbose output: the
// tests that failed (the first two) and the first lines
// that name a seed or, if none does, the first failure message.
func evidence(out string) string {
	var failed, seeds []string
	first := ""
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(line, "--- FAIL: "); ok {
			name, _, _ = strings.Cut(name, " (")
			failed = append(failed, name)
			continue
		}
		if first == "" && (message.MatchString(line) || strings.HasPrefix(line, "Error:")) {
			first = line
		}
		if len(seeds) < 2 && message.MatchString(line) && seedWord.MatchString(line) {
			seeds = append(seeds, line)
		}
	}
	if len(seeds) == 0 && first != "" {
		seeds = []string{first}
	}
	tests := strings.Join(failed[:min(2, len(failed))], ", ")
	if len(failed) > 2 {
		tests += fmt.Sprintf(" and %d more", len(failed)-2)
	}
	return tests + "\n\t" + strings.Join(seeds, "\n\t")
}

var (
	seedWord = regexp.MustCompile(`\bseed \d+`)
	// message is a line a test wrote with t.Log or t.Error.
	message = regexp.MustCompile(`^[\w.-]+\.go:\d+: \S`)
)

// tail is the end of a long output, enough to see why it ended.
func tail(out string) string {
	const keep = 4000
	if len(out) <= keep {
		return out
	}
	return "...\n" + out[len(out)-keep:]
}

// moduleRoot is the directory of the go.mod above the working directory,
// which go test sets to the package's.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("mutant: no go.mod above the working directory")
		}
		dir = parent
	}
}
