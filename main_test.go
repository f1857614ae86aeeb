package idem_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// Client, fake server, proxy and child process must be cleaned up.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
