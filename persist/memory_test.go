package persist_test

import (
	"testing"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	persisttest.Run(t, func(*testing.T) persist.Store { return persist.NewMemory(nil) })
}
