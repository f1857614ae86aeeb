package sim

import (
	"testing"

	"go.uber.org/goleak"
)

// Every server worker of a run ends with the run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
