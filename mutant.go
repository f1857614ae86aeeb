//go:build !idem_mutant

package idem

// The mutants of the idem_mutant build (mutant_on.go) are compiled away
// here: each is a constant false that its one-line change consults. Each
// reverts a rule that keeps "never twice" true; internal/sim's
// TestMutantsAreKilled requires the simulation to catch every one.
const (
	// mutantReconcileFromCreation trusts a lookup's 404 once the intent is
	// older than the reconcile delay, whenever its last attempt left.
	mutantReconcileFromCreation = false
	// mutant5xxFinal takes a 5xx above 504 (a proxy's 520-524) for a final
	// answer.
	mutant5xxFinal = false
	// mutantLatestByWallClock picks an action's latest intent by creation
	// time instead of sequence.
	mutantLatestByWallClock = false
	// mutantRedirectAnswerIsOutcome follows a 301, 302 or 303 after a POST
	// and takes the GET's answer for the intent's outcome.
	mutantRedirectAnswerIsOutcome = false
	// mutantKeySpellingFromOption spells the key as the current Client's
	// option says, not as stored with the intent.
	mutantKeySpellingFromOption = false
)
