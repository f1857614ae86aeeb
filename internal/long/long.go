// Package long tells tests whether the heavy runs are wanted.
//
// Heavy tests build and run mutants, walk long seed ranges or start real
// infrastructure (a standby, a pooler, a migration tool). They run only
// when IDEM_LONG=1, which CI sets. A plain `go test ./...` skips them and
// says which switch runs them.
package long

import (
	"os"
	"testing"
)

// Env is the environment variable that turns the heavy tests on.
const Env = "IDEM_LONG"

// Enabled reports whether IDEM_LONG=1.
func Enabled() bool { return os.Getenv(Env) == "1" }

// Skip skips t unless IDEM_LONG=1. what says what the test does, for the
// skip message.
func Skip(t testing.TB, what string) {
	t.Helper()
	if !Enabled() {
		t.Skipf("%s: runs only with %s=1", what, Env)
	}
}
