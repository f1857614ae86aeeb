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
			Name: "intent-in-process-memory", File: "fakeserver/pgfake/pgfake.go",
			Note:    "on PostgreSQL the intent to charge is not written where other processes find it",
			Anchor:  "return true, s.addIntent(ctx, id, in, now)",
			Replace: "return true, nil",
			Pkg:     "./fakeserver", Run: "^TestLookupNeverLosesADeadProcessesCharge$", Env: pg,
		},
		{
			Name: "lookup-nonce-not-echoed", File: "idempotency/lookup.go",
			Note:    "the lookup's answers do not echo its nonce, so no client can trust its miss",
			Anchor:  "\t\th[LookupNonceHeader] = []string{n[0]}\n",
			Replace: "\t\t_ = n\n",
			Pkg:     "./fakeserver", Run: "^TestLookupEchoesItsNonce$",
		},
		{
			Name: "lookup-unavailable-is-500", File: "fakeserver/lookup.go",
			Note:    "the lookup answers 500 when its store reached a standby or had no answer in time, where a POST answers 503",
			Anchor:  "if !errors.Is(err, idempotency.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {",
			Replace: "if true {",
			Pkg:     "./fakeserver", Run: "^TestLookupOfAStoreThatCannotDecide$",
		},
		{
			Name: "lookup-waits-for-expiry", File: "fakeserver/lookup.go",
			Note:    "the lookup answers 409 for a dead worker's record until it expires",
			Anchor:  "p, settled, err = h.recoverRecord(ctx, rec, now)",
			Replace: "settled = false",
			Pkg:     "./fakeserver", Run: "^TestLookupRecoversADeadWorkersChargeWithinTheLease$",
		},
		{
			Name: "lookup-answers-old-payment", File: "fakeserver/pgfake/pgfake.go",
			// In memory the ledger keeps the key's latest intent, so only
			// PostgreSQL's latest payment under the key tells them apart.
			Note:    "the lookup answers the key's latest payment, not its live record's",
			Anchor:  "`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND id = $2`, idempotency.PrincipalDigest(principal), id)",
			Replace: "`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND idem_key = (SELECT idem_key FROM fake_intents WHERE id = $2) ORDER BY seq DESC LIMIT 1`, idempotency.PrincipalDigest(principal), id)",
			Pkg:     "./fakeserver", Run: "^TestLookupOfAKeyReusedAfterRetentionAnswersTheNewRequest$",
			Env: append([]string{envPostgres + "=1"}, pg...),
		},
		{
			Name: "sweep-without-recovery", File: "fakeserver/pgfake/pgfake.go",
			Note:    "the sweep deletes a dead worker's expired record without recording its charge",
			Anchor:  "if err := s.recoverExpired(ctx); err != nil {",
			Replace: "if err := error(nil); err != nil {",
			Pkg:     "./fakeserver", Run: "^TestSweepRecordsADeadWorkersChargeBeforeDeletingItsRecord$", Env: pg,
		},
		{
			Name: "commit-outlives-abort", File: "fakeserver/pgfake/pgfake.go",
			Note:    "the middleware's Complete is not bounded by the context given to pgfake.New",
			Anchor:  "s.records, s.store = abortable{Store: store, life: st.life}, store",
			Replace: "s.records, s.store = store, store",
			Pkg:     "./fakeserver/pgfake", Run: "^TestNewsContextEndsACommitWaitingOnALock$", Env: pg,
		},
		{
			Name: "fake-scopes-by-credential", File: "fakeserver/payments.go",
			Note:    "a test token is its own caller, so a refreshed token's retry pays again",
			Anchor:  "if account, ok := accountOf(v); ok {",
			Replace: `if account, ok := accountOf(v); ok && account == "" {`,
			Pkg:     "./fakeserver", Run: "^TestATestTokenNamesItsAccount$", Env: pg,
		},
		{
			Name: "fake-payments-in-clear", File: "fakeserver/pgfake/pgfake.go",
			Note:    "the payments table keeps the caller itself",
			Anchor:  "return s.insertPayment(ctx, p, idempotency.PrincipalDigest(p.Principal))",
			Replace: "return s.insertPayment(ctx, p, p.Principal)",
			Pkg:     "./fakeserver/pgfake", Run: "^TestTablesNeverShowTheCredential$", Env: pg,
		},
		{
			Name: "fake-internal-error-shown", File: "fakeserver/payments.go",
			Note:    "a 500 answer carries the database's error text",
			Anchor:  `Detail: "the server failed; retry later"}`,
			Replace: `Detail: err.Error()}`,
			Pkg:     "./fakeserver", Run: "^TestDatabaseErrorsAreLoggedNeverShown$", Env: pg,
		},
		{
			Name: "uuid-keys-compared-by-case-on-postgres", File: "internal/idemkey/key.go",
			Note:    "in UUID mode, on PostgreSQL, a key in upper case and its lower-cased retry are two payments",
			Anchor:  "return Canonical(key, requireUUID), nil",
			Replace: "return key, nil",
			Pkg:     "./fakeserver", Run: "^TestOneKeyOneRecord$/on_PostgreSQL$", Env: pg,
		},
		{
			Name: "lookup-compares-key-by-case", File: "fakeserver/payments.go",
			Note:    "in UUID mode the lookup by key compares the key as sent, not in the form the records hold",
			Anchor:  "Key: idemkey.Canonical(key, h.cfg.uuid)",
			Replace: "Key: key",
			Pkg:     "./fakeserver", Run: "^TestOneKeyOneRecord$",
		},
	})
}
