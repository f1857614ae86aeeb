package fakeserver_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the fake server's tests to kill the mutants of its
// rules on dead workers' charges, on shutdown, on the app's own endpoints,
// on faults and on TLS.
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
			Note:    "the payment written in Complete's transaction is not bounded by the context given to pgfake.New",
			Anchor:  "\tctx, cancel := s.bound(ctx)\n\tdefer cancel()\n\treturn s.addPayment(ctx, p)",
			Replace: "\treturn s.addPayment(ctx, p)",
			Pkg:     "./fakeserver/pgfake", Run: "^TestNew$/^its_context_ends_a_commit_waiting_on_a_lock$", Env: pg,
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
			Pkg:     "./fakeserver/pgfake", Run: "^TestNew$/^the_tables_never_show_the_credential$", Env: pg,
		},
		{
			Name: "fake-internal-error-shown", File: "fakeserver/payments.go",
			Note:    "a 500 answer carries the database's error text",
			Anchor:  `Detail: "the server failed; retry later"}`,
			Replace: `Detail: err.Error()}`,
			Pkg:     "./fakeserver", Run: "^TestDatabaseErrorsAreLoggedNeverShown$", Env: pg,
		},
		{
			Name: "uuid-keys-compared-by-case-on-postgres", File: "idempotency/key.go",
			Note:    "in UUID mode, on PostgreSQL, a key in upper case and its lower-cased retry are two payments",
			Anchor:  "return CanonicalKey(key, requireUUID), nil",
			Replace: "return key, nil",
			Pkg:     "./fakeserver", Run: "^TestOneKeyOneRecord$/on_PostgreSQL$", Env: pg,
		},
		{
			Name: "lookup-compares-key-by-case", File: "fakeserver/payments.go",
			Note:    "in UUID mode the lookup by key compares the key as sent, not in the form the records hold",
			Anchor:  "Key: idempotency.CanonicalKey(key, h.cfg.uuid)",
			Replace: "Key: key",
			Pkg:     "./fakeserver", Run: "^TestOneKeyOneRecord$",
		},
		{
			Name: "endpoint-without-layer", File: "fakeserver/endpoints.go",
			Note:    "the app's POST endpoint runs without the idempotency layer: a retry does the work again",
			Anchor:  "if keyed(method) {",
			Replace: "if false {",
			Pkg:     "./fakeserver", Run: "^TestEndpoints$",
		},
		{
			Name: "endpoint-wildcard-takes-payments", File: "fakeserver/handler.go",
			Note:    "an endpoint's wildcard pattern takes POST /payments from the fake's payments",
			Anchor:  "\tcase path == \"/payments\":\n",
			Replace: "\tcase path == \"/payments\" && h.endpoints == nil:\n",
			Pkg:     "./fakeserver", Run: "^TestEndpoints$/wildcard",
		},
		{
			Name: "endpoint-crash-before-work", File: "fakeserver/endpoints.go",
			Note:    "crash_after_provider on an endpoint dies before its handler did the work",
			Anchor:  "\t\t\tnext.ServeHTTP(&discard{h: make(http.Header)}, r)\n",
			Replace: "",
			Pkg:     "./fakeserver", Run: "^TestEndpoints$/having_done_the_work",
		},
		{
			Name: "endpoint-on-fake-paths", File: "fakeserver/endpoints.go",
			Note:    "an endpoint on /payments or /_fake/ is accepted, and never served",
			Anchor:  `case path == "/payments" || strings.HasPrefix(path, "/payments/") || path == "/_fake" || strings.HasPrefix(path, adminPrefix):`,
			Replace: "case false:",
			Pkg:     "./fakeserver", Run: "^TestEndpoints$/cannot_serve",
		},
		{
			Name: "endpoint-wrong-method-not-found", File: "fakeserver/handler.go",
			Note:    "another method on an endpoint's path is 404, hiding the client's wrong method",
			Anchor:  "case h.endpoints != nil && h.endpointNotAllowed(w, r):",
			Replace: "case false:",
			Pkg:     "./fakeserver", Run: "^TestEndpoints$/another_method",
		},
		{
			Name: "fake-fault-key-ignored", File: "fakeserver/faults.go",
			Note:    "a fault's key is not part of its rule, so it strikes every key",
			Anchor:  "when = append(when, fault.Key(f.Key))",
			Replace: "_ = f.Key",
			Pkg:     "./fakeserver", Run: "^TestFaultMatching$",
		},
		{
			Name: "fake-rule-unnumbered", File: "fakeserver/handler.go",
			Note:    "a rule's ops carry no request number, so fault.Attempt never matches",
			Anchor:  "op.Attempt = n",
			Replace: "_ = n",
			Pkg:     "./fakeserver", Run: "^TestInjectRule$",
		},
		{
			Name: "fake-status-rule-body-dropped", File: "fakeserver/handler.go",
			Note:    "a status rule's own header and body are replaced by the server's problem",
			Anchor:  "if st.Header != nil || st.Body != nil {",
			Replace: "if false {",
			Pkg:     "./fakeserver", Run: "^TestInjectRule$",
		},
		{
			Name: "fake-drawn-effect-unchecked", File: "fakeserver/handler.go",
			Note:    "a drawn effect that is not a valid fault is applied, and a status of 0 kills the request",
			Anchor:  "return validEffects(h.faults.Inject(op))",
			Replace: "return h.faults.Inject(op)",
			Pkg:     "./fakeserver", Run: "^TestInjectRule$",
		},
		{
			Name: "tls-server-speaks-http", File: "fakeserver/server.go",
			Note:    "NewTLSServer serves cleartext HTTP",
			Anchor:  "s.startTLS()",
			Replace: "s.start()",
			Pkg:     "./fakeserver", Run: "^TestTLSServer$",
		},
		{
			Name: "program-tls-kept-cert-unchecked", File: "cmd/fakeserver/tls.go",
			Note:    "a kept certificate that does not name a host asked for is served, and fails on the device",
			Anchor:  "if err := leaf.VerifyHostname(h); err != nil {",
			Replace: "if err := leaf.VerifyHostname(h); err != nil && false {",
			Pkg:     "./cmd/fakeserver", Run: "^TestProgramTLS$",
		},
		{
			Name: "program-tls-key-readable", File: "cmd/fakeserver/tls.go",
			Note:    "the kept private key is readable by every user of the machine",
			Anchor:  "os.WriteFile(keyFile, keyPEM, 0o600)",
			Replace: "os.WriteFile(keyFile, keyPEM, 0o644)",
			Pkg:     "./cmd/fakeserver", Run: "^TestProgramTLS$",
		},
		{
			Name: "program-tls-cleartext", File: "cmd/fakeserver/main.go",
			Note:    "-tls writes a certificate and serves cleartext",
			Anchor:  "return tls.NewListener(ln, ",
			Replace: "return ln, nil\n\treturn tls.NewListener(ln, ",
			Pkg:     "./cmd/fakeserver", Run: "^TestProgramTLS$",
		},
		{
			Name: "options-sleep-ignored", File: "fakeserver/options.go",
			Note:    "the delays wait in real time whatever Options.Sleep says",
			Anchor:  "if c.sleep == nil {",
			Replace: "if true {",
			Pkg:     "./fakeserver", Run: "^TestOptions$/^Sleep",
		},
		{
			Name: "options-new-id-ignored", File: "fakeserver/payments.go",
			Note:    "payment ids ignore Options.NewID",
			Anchor:  "if h.cfg.newID != nil {",
			Replace: "if false {",
			Pkg:     "./fakeserver", Run: "^TestOptions$/^NewID",
		},
		{
			Name: "options-wrap-records-ignored", File: "fakeserver/handler.go",
			Note:    "the idempotency layer uses the bare store whatever Options.WrapRecords says",
			Anchor:  "records = h.cfg.wrapRecords(records)",
			Replace: "_ = h.cfg.wrapRecords(records)",
			Pkg:     "./fakeserver", Run: "^TestOptions$/^WrapRecords",
		},
		{
			Name: "charges-without-request", File: "fakeserver/payments.go",
			Note:    "the provider's charges do not name the request that made them",
			Anchor:  "Record: info.ID, Description: req.Description})",
			Replace: "})",
			Pkg:     "./fakeserver", Run: "^TestCharges$",
		},
	})
}
