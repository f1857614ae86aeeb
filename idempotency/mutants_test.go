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
		{
			Name: "memory-lease-on-callers-clock", File: "idempotency/memory.go",
			Note:    "the memory store judges a takeover on its caller's clock, not its own",
			Anchor:  "lease := until.Sub(now)\n\tnow = s.now(now)\n",
			Replace: "lease := until.Sub(now)\n",
			Pkg:     "./idempotency", Run: "^TestMemoryStoreConformance$",
		},
		{
			Name: "give-up-keeps-lease", File: "idempotency/memory.go",
			Note:    "an owner giving its record up leaves its lease running",
			Anchor:  `(to != "" && r.LockedUntil.After(now))`,
			Replace: "r.LockedUntil.After(now)",
			Pkg:     "./idempotency", Run: "^(TestMemoryStoreConformance|TestAServerErrorKeepsTheStableIDForTheRetry)$",
		},
		{
			// The simulated server echoes the key itself, as received
			// (it rewrites keys to compare them raw).
			Name: "no-key-echo", File: "idempotency/middleware.go",
			Note:    "the middleware's answers do not carry the request's key back",
			Anchor:  "	w = echoKey(w, r)\n",
			Replace: "",
			Pkg:     "./idempotency", Run: "^TestEveryAnswerToAKeyedRequestEchoesTheKey$",
		},
	})
}
