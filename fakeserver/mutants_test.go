package fakeserver_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the fake server's tests to kill the mutants of its
// rules on dead workers' charges and on shutdown.
func TestMutants(t *testing.T) {
	pg := []string{"IDEM_REQUIRE_POSTGRES=1"}
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "intent-in-process-memory", File: "fakeserver/state.go",
			Note:    "on PostgreSQL the intent to charge is kept in the memory of the process that made it",
			Anchor:  "return true, h.pg.addIntent(ctx, id, r, h.cfg.now())",
			Replace: "return h.ledger.reserve(id, r), nil",
			Pkg:     "./fakeserver", Run: "^TestLookupNeverLosesADeadProcessesCharge$", Env: pg,
		},
		{
			Name: "lookup-waits-for-expiry", File: "fakeserver/lookup.go",
			Note:    "the lookup answers 409 for a dead worker's record until it expires",
			Anchor:  "p, settled, err = h.recoverRecord(ctx, rec, now)",
			Replace: "settled = false",
			Pkg:     "./fakeserver", Run: "^TestLookupRecoversADeadWorkersChargeWithinTheLease$",
		},
		{
			Name: "lookup-answers-old-payment", File: "fakeserver/lookup.go",
			// In memory the ledger keeps the key's latest intent, so only
			// PostgreSQL's latest payment under the key tells them apart.
			Note:    "the lookup answers the key's latest payment, not its live record's",
			Anchor:  "p, paid, err = h.findPayment(ctx, id.Principal, rec.StableID)",
			Replace: "p, paid, err = h.findPaymentByKey(ctx, id.Principal, id.Key)",
			Pkg:     "./fakeserver", Run: "^TestLookupOfAKeyReusedAfterRetentionAnswersTheNewRequest$",
			Env: append([]string{envPostgres + "=1"}, pg...),
		},
		{
			Name: "sweep-without-recovery", File: "fakeserver/handler.go",
			Note:    "the sweep deletes a dead worker's expired record without recording its charge",
			Anchor:  "if err := h.pg.recoverExpired(ctx); err != nil {",
			Replace: "if err := error(nil); err != nil {",
			Pkg:     "./fakeserver", Run: "^TestSweepRecordsADeadWorkersChargeBeforeDeletingItsRecord$", Env: pg,
		},
		{
			Name: "commit-outlives-abort", File: "fakeserver/handler.go",
			Note:    "the middleware's Complete is not bounded by Abort",
			Anchor:  "store = abortable{Store: h.pg.store, h: h}",
			Replace: "store = h.pg.store",
			Pkg:     "./fakeserver", Run: "^TestAbortEndsACommitWaitingOnALock$", Env: pg,
		},
		{
			Name: "fake-scopes-by-credential", File: "fakeserver/payments.go",
			Note:    "a test token is its own caller, so a refreshed token's retry pays again",
			Anchor:  "if account, ok := AccountOf(v); ok {",
			Replace: `if account, ok := AccountOf(v); ok && account == "" {`,
			Pkg:     "./fakeserver", Run: "^TestATestTokenNamesItsAccount$", Env: pg,
		},
		{
			Name: "fake-payments-in-clear", File: "fakeserver/postgres.go",
			Note:    "the payments table keeps the caller itself",
			Anchor:  "return s.insertPayment(ctx, p, idempotency.PrincipalDigest(p.principal))",
			Replace: "return s.insertPayment(ctx, p, p.principal)",
			Pkg:     "./fakeserver", Run: "^TestTablesNeverShowTheCredential$", Env: pg,
		},
		{
			Name: "fake-internal-error-shown", File: "fakeserver/payments.go",
			Note:    "a 500 answer carries the database's error text",
			Anchor:  `Detail: "the server failed; retry later"}`,
			Replace: `Detail: err.Error()}`,
			Pkg:     "./fakeserver", Run: "^TestDatabaseErrorsAreLoggedNeverShown$", Env: pg,
		},
	})
}
