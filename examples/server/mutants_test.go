package main

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the program's tests to kill the mutants of its
// rules: who the caller is, what the lookup answers, and the fault hook's
// bounds.
func TestMutants(t *testing.T) {
	const pkg = "./examples/server"
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "server-one-namespace", File: "examples/server/main.go",
			Note:    "every caller shares one key namespace: a second account's payment gets the first one's stored answer",
			Anchor:  "account, _ := r.Context().Value(accountKey{}).(string)",
			Replace: "_, account := r.Context().Value(accountKey{}).(string), \"\"",
			Pkg:     pkg, Run: "^TestPayments$",
		},
		{
			Name: "server-unknown-token-admitted", File: "examples/server/main.go",
			Note:    "a request without a known token is served, as the anonymous account",
			Anchor:  `if account == "" {`,
			Replace: `if account == "" && false {`,
			Pkg:     pkg, Run: "^TestPayments$",
		},
		{
			Name: "server-lookup-unscoped", File: "examples/server/main.go",
			Note:    "the lookup reads the record of no account: the caller's running request looks unused (404)",
			Anchor:  "idempotency.ID{Principal: account, Key: key}",
			Replace: `idempotency.ID{Principal: "", Key: key}`,
			Pkg:     pkg, Run: "^TestFaultHook$",
		},
		{
			Name: "server-lookup-forgets-swept-payments", File: "examples/server/main.go",
			Note:    "once its record is swept, the lookup answers 404 for a payment that was made",
			Anchor:  `if id == "" {`,
			Replace: `if id == "" && false {`,
			Pkg:     pkg, Run: "^TestLookup$",
		},
		{
			Name: "server-lookup-running-is-unused", File: "examples/server/main.go",
			Note:    "a key whose request runs is looked up as unused (404) rather than 409",
			Anchor:  "case found && rec.Status != idempotency.StatusCompleted:",
			Replace: "case false:",
			Pkg:     pkg, Run: "^TestFaultHook$",
		},
		{
			Name: "server-lookup-quoted-key-invalid", File: "examples/server/main.go",
			Note:    "the lookup refuses the sf-string form of a key the middleware takes",
			Anchor:  "if strings.HasPrefix(raw, `\"`) {",
			Replace: "if false {",
			Pkg:     pkg, Run: "^TestLookup$",
		},
		{
			Name: "faulthook-unbounded", File: "examples/server/faulthook/faulthook.go",
			Note:    "the hook keeps every fault armed: memory without bound",
			Anchor:  "full := len(h.armed) >= MaxPending",
			Replace: "full := false",
			Pkg:     pkg, Run: "^TestFaultHook$",
		},
		{
			Name: "faulthook-left-client-stored", File: "examples/server/faulthook/faulthook.go",
			Note:    "a held request whose client left is answered 200 and stored, so its key never pays",
			Anchor:  "Status: http.StatusServiceUnavailable, Detail: \"the client left while the fault hook held the work\"",
			Replace: "Status: http.StatusOK, Detail: \"the client left while the fault hook held the work\"",
			Pkg:     pkg, Run: "^TestFaultHook$",
		},
	})
}
