//go:build idem_mutant

package idempotency

import (
	"context"
	"os"
	"time"
)

// Mutants for internal/sim's mutant test, chosen with IDEM_MUTANT. They
// exist only in a build with the idem_mutant tag.

// mutantLookupFirst looks a key up before inserting it and trusts the
// "absent" it saw, the race the unique constraint exists to decide.
var mutantLookupFirst = os.Getenv("IDEM_MUTANT") == "server-lookup-before-insert"

// mutantNamesKeepCase compares JSON member names as they are spelled, not
// folded as encoding/json matches them to struct fields.
var mutantNamesKeepCase = os.Getenv("IDEM_MUTANT") == "fingerprint-ignores-member-case"

// lookedUpAbsent reports that the store has no live record for id, through
// the Get of stores that have one (MemoryStore).
func (m *Middleware) lookedUpAbsent(ctx context.Context, id ID, now time.Time) bool {
	g, ok := m.cfg.Store.(interface {
		Get(context.Context, ID, time.Time) (*Record, bool)
	})
	if !ok {
		return false
	}
	_, found := g.Get(ctx, id, now)
	return !found
}
