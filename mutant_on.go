//go:build idem_mutant

package idem

import "os"

// Mutants for internal/sim's mutant test, chosen with IDEM_MUTANT. They
// exist only in a build with the idem_mutant tag; see mutant.go.
var (
	mutantReconcileFromCreation   = os.Getenv("IDEM_MUTANT") == "reconcile-delay-from-creation"
	mutant5xxFinal                = os.Getenv("IDEM_MUTANT") == "5xx-final"
	mutantLatestByWallClock       = os.Getenv("IDEM_MUTANT") == "latest-by-wall-clock"
	mutantRedirectAnswerIsOutcome = os.Getenv("IDEM_MUTANT") == "redirect-answer-is-outcome"
	mutantKeySpellingFromOption   = os.Getenv("IDEM_MUTANT") == "key-spelling-from-option"
)
