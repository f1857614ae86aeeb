package idempotency_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the middleware's own tests to kill the mutants of
// the rules the simulated world cannot reach.
func TestMutants(t *testing.T) {
	mutant.Test(t, []mutant.Mutant{
		{
			// idem never sends two bodies under one key, so the simulated
			// world cannot reach the fingerprint's rules on member names.
			Name: "fingerprint-ignores-member-case", File: "idempotency/fingerprint.go",
			Note:    "member names are compared as spelled, not folded as encoding/json folds them",
			Anchor:  "c.fold = appendFoldedName(c.fold, c.nameOf(m))",
			Replace: "c.fold = append(c.fold, c.nameOf(m)...)",
			Pkg:     "./idempotency", Run: "^TestFingerprintNeverSharedByBodiesReadDifferently$",
		},
	})
}
