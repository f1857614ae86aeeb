package fault_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the package's tests to kill the mutants of its
// rules on order, counts and draws.
func TestMutants(t *testing.T) {
	const pkg = "./fakeserver/fault"
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "fault-list-asks-taken-kind", File: "fakeserver/fault/fault.go",
			Note:    "a List asks a rule whose kind an earlier rule took, and the rule spends a strike on an op it never struck",
			Anchor:  "if r.Draw != nil || !es.Has(r.Effect.Kind) {",
			Replace: "if true {",
			Pkg:     pkg, Run: "^TestList$",
		},
		{
			Name: "fault-list-final-not-first", File: "fakeserver/fault/fault.go",
			Note:    "a List asks the rules of final kinds with the others, and a rule spends a strike on an op a final rule ended",
			Anchor:  "\t\t\tif es := r.Inject(op); len(es) > 0 {\n\t\t\t\tl.dropSpent()\n\t\t\t\treturn es\n\t\t\t}\n",
			Replace: "\t\t\t_ = op\n",
			Pkg:     pkg, Run: "^TestList$/^a_final_kind_that_strikes_ends_the_asking$",
		},
		{
			Name: "fault-rule-strikes-uncounted", File: "fakeserver/fault/fault.go",
			Note:    "a Rule does not count its strikes, and strikes past its Times",
			Anchor:  "if r.Times > 0 && r.struck.Add(1) > int64(r.Times) {",
			Replace: "if r.Times > 0 && r.struck.Load() > int64(r.Times) {",
			Pkg:     pkg, Run: "^TestRule$",
		},
		{
			Name: "fault-left-zero-when-negative", File: "fakeserver/fault/fault.go",
			Note:    "Left says 0 for a rule of negative Times, which strikes without limit",
			Anchor:  "if r.Times <= 0 {\n\t\treturn -1",
			Replace: "if r.Times == 0 {\n\t\treturn -1",
			Pkg:     pkg, Run: "^TestRule$/^a_negative_Times_strikes_without_limit,_and_Left_says_so$",
		},
		{
			Name: "fault-first-asks-all", File: "fakeserver/fault/fault.go",
			Note:    "First asks the injectors after the one that answered, so their chances draw",
			Anchor:  "\tfor _, inj := range f {\n\t\tif es := inj.Inject(op); len(es) > 0 {\n\t\t\treturn es\n",
			Replace: "\tfor i, inj := range f {\n\t\tif es := inj.Inject(op); len(es) > 0 {\n\t\t\tfor _, rest := range f[i+1:] {\n\t\t\t\trest.Inject(op)\n\t\t\t}\n\t\t\treturn es\n",
			Pkg:     pkg, Run: "^TestFirst$",
		},
		{
			Name: "fault-and-asks-every-predicate", File: "fakeserver/fault/predicate.go",
			Note:    "And asks every predicate after a miss, so a chance draws where && would not and a seed's later draws shift",
			Anchor:  "\t\tfor _, p := range ps {\n\t\t\tif !p(op) {\n\t\t\t\treturn false\n\t\t\t}\n\t\t}\n\t\treturn true\n",
			Replace: "\t\tok := true\n\t\tfor _, p := range ps {\n\t\t\tok = p(op) && ok\n\t\t}\n\t\treturn ok\n",
			Pkg:     pkg, Run: "^TestPredicates$",
		},
		{
			Name: "fault-chance-draws-at-zero", File: "fakeserver/fault/predicate.go",
			Note:    "a chance of 0 draws, so turning a class off shifts every later draw of the seed",
			Anchor:  "return p > 0 && src.Float64() < p",
			Replace: "return src.Float64() < p",
			Pkg:     pkg, Run: "^TestChance$",
		},
	})
}
