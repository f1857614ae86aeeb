package contractcheck_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestMain fails the package's tests if any goroutine outlives them, and
// stops the PostgreSQL server the tests started, if any.
func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
