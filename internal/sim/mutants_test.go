package sim

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// mutants revert the rules that keep "never twice" true in the client and
// the server middleware; the simulation, in its default budget, must catch
// every one. Each row is applied with go test -overlay (see
// internal/mutant), so the production code has no trace of it.
var mutants = []mutant.Mutant{
	{
		Pkg: simPkg, Run: simRun,
		Name: "server-lookup-before-insert", File: "idempotency/middleware.go",
		Note: `a lookup's "absent" is trusted over Insert's conflict, the race the unique constraint decides`,
		Anchor: `	for range 3 {
		existing, inserted, err := m.cfg.Store.Insert(ctx, rec)
`,
		Replace: `	var absent bool
	if g, ok := m.cfg.Store.(interface {
		Get(context.Context, ID, time.Time) (*Record, bool)
	}); ok {
		_, found := g.Get(ctx, rec.ID, now)
		absent = !found
	}
	for range 3 {
		existing, inserted, err := m.cfg.Store.Insert(ctx, rec)
		inserted = inserted || absent && err == nil
`,
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "reconcile-delay-from-creation", File: "reconcile.go",
		Note:    "a 404 is trusted once the intent is older than the reconcile delay, whenever its last attempt left",
		Anchor:  "	wait := c.mayStillArrive(key)\n",
		Replace: "	wait := max(c.reconcile-c.clock.Now().Sub(cur.CreatedAt), 0)\n",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "5xx-final", File: "retry.go",
		Note:    "a 5xx above 504 (a proxy's 520-524) is a final answer",
		Anchor:  "case code < 100 || code > 599, code >= 500:",
		Replace: "case code < 100 || code > 599, code >= 500 && code <= 504:",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "intent-saved-when-shown", File: "intent.go",
		Note:    "an intent is saved when the Pay screen shows it, so a restart settles a cart nobody tapped",
		Anchor:  "\tin := &Intent{rec: rec, c: c, unarmed: true, force: forceNew}\n",
		Replace: "\tin := &Intent{rec: rec, c: c, unarmed: true, force: forceNew}\n\tif err := persist.SaveShared(ctx, c.store, rec); err != nil {\n\t\treturn nil, err\n\t}\n",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "key-spelling-from-option", File: "adapter.go",
		Note:    "the key is spelled as the current Client's option says, not as stored with the intent",
		Anchor:  "	req.Header = attemptHeader(header, rec.KeyHeader)\n",
		Replace: "	req.Header = attemptHeader(header, rec.KeyHeader)\n\treq.Header.Set(\"Idempotency-Key\", c.keyHeader(rec.Key))\n",
	},
	// redirect-answer-is-outcome is the root package's: the login page
	// that the followed GET reaches does not echo the key, so in the
	// simulation the client leaves the outcome unknown on it anyway.
}

// The simulation in its default budget: it stops at the first seed that
// breaks an invariant.
const simPkg, simRun = "./internal/sim", "^TestSimulation$"

// TestMutants requires the simulation to kill each of mutants, and to
// pass without them.
func TestMutants(t *testing.T) { mutant.Test(t, mutants) }
