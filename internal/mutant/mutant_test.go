package mutant

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A tiny module to apply mutants to: Add is tested, Unused is not, and
// TestFlaky fails whenever FLAKY is set.
var tinyModule = map[string]string{
	"go.mod": "module example.com/tiny\n\ngo 1.24\n",
	"tiny.go": `package tiny

func Add(a, b int) int { return a + b }

func Unused(a int) int { return a * 2 }
`,
	"tiny_test.go": `package tiny

import (
	"os"
	"testing"
)

func TestAdd(t *testing.T) {
	for seed := 1; seed <= 3; seed++ {
		if got := Add(seed, 3); got != seed+3 {
			t.Fatalf("seed %d: Add(%d, 3) = %d", seed, seed, got)
		}
	}
}

func TestFlaky(t *testing.T) {
	if os.Getenv("FLAKY") != "" {
		t.Fatal("flaky")
	}
}
`,
}

func writeModule(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range tinyModule {
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(content), 0o644))
	}
	return root
}

// TestCheck checks the rows before anything is built.
func TestCheck(t *testing.T) {
	// A row that no longer applies as written is reported with its name and
	// what is wrong, before anything is built.
	t.Run("reports every row that cannot apply", func(t *testing.T) {
		root := writeModule(t)
		ok := Mutant{Name: "sub", File: "tiny.go", Anchor: "a + b", Replace: "a - b", Pkg: ".", Run: "^TestAdd$"}
		assert.Empty(t, Check(root, []Mutant{ok}))

		rows := []Mutant{
			{Name: "gone", File: "tiny.go", Anchor: "a + b + c", Replace: "a", Pkg: ".", Run: "^TestAdd$"},
			{Name: "twice", File: "tiny.go", Anchor: "return a", Replace: "return 0", Pkg: ".", Run: "^TestAdd$"},
			{Name: "no-file", File: "missing.go", Anchor: "x", Replace: "y", Pkg: ".", Run: "^TestAdd$"},
			{Name: "same", File: "tiny.go", Anchor: "a + b", Replace: "a + b", Pkg: ".", Run: "^TestAdd$"},
			{Name: "no-test", File: "tiny.go", Anchor: "a + b", Replace: "a - b"},
			{Name: "outside", File: "../tiny.go", Anchor: "a + b", Replace: "a - b", Pkg: ".", Run: "^TestAdd$"},
			ok, ok,
		}
		var msgs []string
		for _, err := range Check(root, rows) {
			msgs = append(msgs, err.Error())
		}
		require.Len(t, msgs, 7, "%q", msgs)
		assert.Contains(t, msgs[0], `mutant "gone" (tiny.go): the anchor occurs 0 times in the file, not once`)
		assert.Contains(t, msgs[1], `mutant "twice" (tiny.go): the anchor occurs 2 times in the file, not once`)
		assert.Contains(t, msgs[2], `mutant "no-file" (missing.go)`)
		assert.Contains(t, msgs[3], `mutant "same" (tiny.go): the replacement is the anchor`)
		assert.Contains(t, msgs[4], `mutant "no-test" (tiny.go): no Pkg or Run`)
		assert.Contains(t, msgs[5], `mutant "outside" (../tiny.go): File must be relative to the module root`)
		assert.Contains(t, msgs[6], `mutant "sub" (tiny.go): the name is used by another row`)
	})
}

// The verdicts on a real module: a mutant the test catches is killed, with
// the failing test and its seed; one it does not catch survives; one that
// does not compile, or whose test fails or runs nothing without it, is an
// error, never a kill.
func TestVerdicts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	root := writeModule(t)
	r, err := newRunner(root, t.TempDir())
	require.NoError(t, err)
	ctx := context.Background()
	add := Mutant{File: "tiny.go", Pkg: ".", Run: "^TestAdd$"}
	row := func(name, anchor, replace string) Mutant {
		m := add
		m.Name, m.Anchor, m.Replace = name, anchor, replace
		return m
	}

	killedBy, err := r.verdict(ctx, row("sub", "a + b", "a - b"))
	require.NoError(t, err)
	assert.Contains(t, killedBy, "TestAdd")
	assert.Contains(t, killedBy, "seed 1: Add(1, 3) = -2")

	_, err = r.verdict(ctx, row("untested", "a * 2", "a * 3"))
	require.ErrorContains(t, err, `mutant "untested" survived`)

	_, err = r.verdict(ctx, row("broken", "a + b", "a +"))
	require.ErrorContains(t, err, `mutant "broken" does not build`)

	flaky := row("flaky", "a + b", "a - b")
	flaky.Run, flaky.Env = "^TestFlaky$", []string{"FLAKY=1"}
	_, err = r.verdict(ctx, flaky)
	require.ErrorContains(t, err, "fails without mutants")

	none := row("none", "a + b", "a - b")
	none.Run = "^TestNothing$"
	_, err = r.verdict(ctx, none)
	require.ErrorContains(t, err, "runs no test")

	assert.EqualValues(t, 1+5, r.builds.Load(), "one unmutated build, one per mutant")
}

// TestEnviron checks the environment of the runs.
func TestEnviron(t *testing.T) {
	// The runs do not inherit the randomized tests' seeds and budgets: a
	// mutant's verdict is the same whatever IDEM_SIM_SEED is set to.
	t.Run("the runs drop the randomized tests' settings", func(t *testing.T) {
		t.Setenv("IDEM_SIM_SEED", "5")
		t.Setenv("IDEM_REQUIRE_POSTGRES", "1")
		env := environ()
		assert.NotContains(t, env, "IDEM_SIM_SEED=5")
		assert.Contains(t, env, "IDEM_REQUIRE_POSTGRES=1")
	})
}
