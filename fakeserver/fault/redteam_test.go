package fault_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver/fault"
)

// TestRuleLeftTellsTheTruth: Rule.Times says "how many ops the rule
// strikes. Zero means no limit", and Left "how many more ops the rule
// strikes, or -1 without limit". Path: a Rule{Times: -1} (a count computed
// as n-1 from n = 0, say) is not refused anywhere: Spent is false, so it
// strikes every op forever, while Left answers 0, "no more". A List never
// drops it. A test that reads Left to know a fault is over is told it is
// over while it still strikes.
func TestRuleLeftTellsTheTruth(t *testing.T) {
	r := &fault.Rule{Times: -1, Effect: fault.Effect{Kind: fault.LoseAnswer}}
	struck := 0
	for range 5 {
		if len(r.Inject(fault.Op{Method: "POST", Path: "/payments"})) > 0 {
			struck++
		}
	}
	require.Equal(t, 5, struck) // it strikes without limit
	require.True(t, r.Left() != 0 || struck == 0,
		"Left() = %d (no more strikes) on a rule that struck %d ops and strikes on", r.Left(), struck)
}
