//go:build !idem_mutant

package idempotency

import (
	"context"
	"time"
)

// The mutants of the idem_mutant build (mutant_on.go) are compiled away
// here: each is a constant false that its one-line change consults.

// mutantLookupFirst looks a key up before inserting it and trusts the
// "absent" it saw, the race the unique constraint exists to decide.
const mutantLookupFirst = false

// mutantNamesKeepCase compares JSON member names as they are spelled, not
// folded as encoding/json matches them to struct fields.
const mutantNamesKeepCase = false

func (m *Middleware) lookedUpAbsent(context.Context, ID, time.Time) bool { return false }
