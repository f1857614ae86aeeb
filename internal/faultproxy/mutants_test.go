package faultproxy_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the proxy's tests to kill the mutants of its rules
// on which connection a cut strikes.
func TestMutants(t *testing.T) {
	const pkg = "./internal/faultproxy"
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "proxy-script-numbers-from-last-script", File: "internal/faultproxy/faultproxy.go",
			Note:    "a script after unscripted connections cuts a connection already served, not the next",
			Anchor:  "p.scripted = max(p.scripted, p.stats.Conns) + 1",
			Replace: "p.scripted++",
			Pkg:     pkg, Run: "^TestInject$",
		},
		{
			Name: "proxy-reset-passes", File: "internal/faultproxy/faultproxy.go",
			Note:    "a rule's fault.Reset is ignored, and the request reaches the server",
			Anchor:  "if _, ok := es.Get(fault.Reset); ok {",
			Replace: "if false {",
			Pkg:     pkg, Run: "^TestInject$",
		},
	})
}
