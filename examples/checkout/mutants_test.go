package main

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the program's tests to kill the mutants of where it
// keeps its intents.
func TestMutants(t *testing.T) {
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "checkout-state-in-cache-dir", File: "examples/checkout/checkout.go",
			Note:    "new intents are kept in the cache directory, which the system may clear",
			Anchor:  "if dir, err := os.UserConfigDir(); err == nil {",
			Replace: "if dir, err := os.UserCacheDir(); err == nil {",
			Pkg:     "./examples/checkout", Run: "^TestState$/^is_kept_in_the_configuration_directory$",
		},
	})
}
