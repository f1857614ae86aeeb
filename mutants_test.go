package idem_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the client's own tests to kill the mutants of the
// rules of the device's life: the tap arms the intent, one writer per
// store, ages read every clock, resolved stays resolved, the RoundTripper
// follows the request, and an answer is never reported as not sent. Each
// row names the test that kills it.
func TestMutants(t *testing.T) {
	const root = "."
	mutant.Test(t, []mutant.Mutant{
		{
			// The login page that the followed GET reaches does not echo
			// the key, so in the simulation the client leaves the outcome
			// unknown on it anyway: the redirect's own test catches this.
			Name: "redirect-answer-is-outcome", File: "redirect.go",
			Note:    "a 301, 302 or 303 after a POST is followed and the GET's answer taken for the outcome",
			Anchor:  "if req.Method != via[0].Method {",
			Replace: "if false {",
			Pkg:     root, Run: "^TestRedirectToGETCarriesNoKey$",
		},
		{
			Name: "not-sent-without-the-trace", File: "call.go",
			Note:    "a transport that fires no trace is taken to have sent nothing",
			Anchor:  "if err == nil || st.onWire && !st.traced.Load() {",
			Replace: "if err == nil {",
			Pkg:     root, Run: "^TestNotSentIsProvenByTheTraceAlone$",
		},
		{
			Name: "not-sent-resent-unrecorded", File: "do.go",
			Note:    "an intent stored not sent is sent again before the store says it may have been",
			Anchor:  `if err := c.saveIf(ctx, in, rec, cur, op); err != nil {`,
			Replace: `if err := error(nil); err != nil || op == "" && cur == nil {`,
			Pkg:     root, Run: "^TestANotSentIntentSentAgainIsStoredNewBeforeItLeaves$",
		},
		{
			Name: "settle-all-resends-not-sent", File: "settle.go",
			Note:    "SettleAll sends an intent the app was told was not sent",
			Anchor:  "if in.State() == persist.StateNotSent {",
			Replace: "if false {",
			Pkg:     root, Run: "^TestARequestThatNeverLeftTheDeviceIsNotSentAndTheChangedCartGoesThrough$",
		},
		{
			Name: "callers-key-unsent", File: "do.go",
			Note:    "a key the caller chose is taken as never sent before",
			Anchor:  "rec.Attempts == 0 && !in.callersKey",
			Replace: "rec.Attempts == 0",
			Pkg:     root, Run: "^TestRoundTripperNeverTakesAStrangersRefusalOfACallersRetry$",
		},
		{
			Name: "echo-compared-as-spelled", File: "key.go",
			Note:    "the echo is compared with the key as spelled, not as the server reads it",
			Anchor:  "	want := echoKey(key)",
			Replace: "	want := key",
			Pkg:     root, Run: "^TestRoundTripperTakesTheEchoOfACallersQuotedKey$",
		},
		{
			Name: "intent-saved-when-shown", File: "intent.go",
			Note:    "an intent is saved when Intent makes it, before the user taps",
			Anchor:  "\tin := &Intent{rec: rec, c: c, unarmed: true, force: forceNew}\n",
			Replace: "\tin := &Intent{rec: rec, c: c, unarmed: true, force: forceNew}\n\tif err := c.store.Save(ctx, rec); err != nil {\n\t\treturn nil, err\n\t}\n",
			Pkg:     root, Run: "^TestSettleAllNeverSendsAnIntentNobodyTapped$",
		},
		{
			Name: "claim-without-check", File: "persist/claim.go",
			Note:    "the store's claim of an action's latest intent saves whatever the action holds",
			Anchor:  "\tif !lost {\n",
			Replace: "\tif true || !lost {\n",
			Pkg:     root, Run: "^TestTwoClientsOnOneStoreMakeOneKeyPerAction$",
		},
		{
			Name: "latest-by-wall-clock", File: "intent.go",
			Note:    "an action's latest intent is the one created last by the device's clock",
			Anchor:  "if r.Seq > latest.Seq || r.Seq == latest.Seq && !r.CreatedAt.Before(latest.CreatedAt) {",
			Replace: "if !r.CreatedAt.Before(latest.CreatedAt) {",
			Pkg:     root, Run: "^TestTheLatestIntentIsTheLastCreatedWhateverTheClock$",
		},
		{
			Name: "age-ignores-sleep", File: "age.go",
			Note:    "an intent's age ignores the clock that counts device sleep",
			Anchor:  "\t\tage = max(age, r.boot-cl.Armed)\n",
			Replace: "\t\t_ = cl\n",
			Pkg:     root, Run: "^TestNoResendPastRetentionWhenTheDeviceSleepsDuringABackoff$",
		},
		{
			Name: "expiry-as-an-instant", File: "do.go",
			Note:    "the time left to send is fixed as an instant on the clock's timeline at the call's start",
			Anchor:  "\tif left() <= 0 {\n",
			Replace: "\texp := c.clock.Now().Add(left())\n\tleft = func() time.Duration { return exp.Sub(c.clock.Now()) }\n\tif left() <= 0 {\n",
			Pkg:     root, Run: "^TestNoResendPastRetentionWhenTheDeviceSleepsDuringABackoff$",
		},
		{
			Name: "age-ignores-wall-mark", File: "age.go",
			Note:    "an intent's age ignores the stored high-water mark of the wall clock",
			Anchor:  "\tage := max(wall, c.mark(r.wall).Sub(armMark))\n",
			Replace: "\tage := wall\n\t_ = armMark\n",
			Pkg:     root, Run: "^TestAClockSetBackBeforeARestartDoesNotMakeAnIntentYounger$",
		},
		{
			Name: "prune-by-wall-clock", File: "age.go",
			Note:    "Prune judges an outcome's age by the wall clock alone",
			Anchor:  "\t\tage = min(age, r.boot-cl.Written)\n",
			Replace: "\t\t_ = cl\n",
			Pkg:     root, Run: "^TestPruneJudgesAnOutcomeByTheSmallestAgeAnyClockReports$",
		},
		{
			Name: "prune-without-tombstone", File: "prune.go",
			Note:    "Prune deletes an action's latest paid intent like any other",
			Anchor:  "\t\tcase keep[r.Key]:\n",
			Replace: "\t\tcase false:\n",
			Pkg:     root, Run: "^TestPruneKeepsWhatMakesTheNextTapOfAPaidActionANoOp$",
		},
		{
			Name: "paid-action-pays-again", File: "intent.go",
			Note:    "a changed request for an action that succeeded makes a new intent",
			Anchor:  "\t\t\tcase latest.State == persist.StateSucceeded && !forceNew:\n\t\t\t\treturn nil, &ResolvedError{Name: name, Previous: c.intentOf(latest)}\n",
			Replace: "",
			Pkg:     root, Run: "^TestIntentForAnAction$",
		},
		{
			Name: "roundtripper-forgets-request", File: "transport.go",
			Note:    "the same *http.Request sent again through the RoundTripper gets a new key",
			Anchor:  "} else if again := t.intentOf(req, live); again != nil {",
			Replace: "} else if again := t.intentOf(req, live); false && again != nil {",
			Pkg:     root, Run: "^TestTheRoundTripperGivesTheSameRequestTheSameKey$",
		},
		{
			Name: "roundtripper-misses-shallow-copy", File: "transport.go",
			Note:    "net/http's shallow copy of a request (an http.Client with a Timeout) is taken for a new request",
			Anchor:  "\twp := weak.Make(req.URL)\n",
			Replace: "\tu := *req.URL\n\twp := weak.Make(&u)\n",
			Pkg:     root, Run: "^TestTheRoundTripperGivesTheSameRequestTheSameKeyUnderAClientTimeout$",
		},
		{
			Name: "roundtripper-spent-body-by-url", File: "transport.go",
			Note:    "a new request with an empty stream that shares another's *url.URL is sent with the other's bytes and key",
			Anchor:  "\treturn va.Equal(vb)\n",
			Replace: "\treturn true\n",
			Pkg:     root, Run: "^TestTheRoundTripperNeverTakesARequestSharingAURLForAnotherRequest$",
		},
		{
			Name: "prune-restarts-sequence", File: "prune.go",
			Note:    "Prune deletes an action's latest intent unless it succeeded, so the action's sequence numbers restart",
			Anchor:  "\t\tcase keep[r.Key]:\n",
			Replace: "\t\tcase keep[r.Key] && r.State == persist.StateSucceeded:\n",
			Pkg:     root, Run: "^TestAnIntentShownBeforePruneNeverOvertakesTheActionsLaterIntent$",
		},
		{
			Name: "resume-without-take-over", File: "do.go",
			Note:    "a Client resumes an armed intent it did not arm without taking it over, so the Client that armed it still takes it for unsent",
			Anchor:  "\tif !in.ephemeral && (rec.State == persist.StateNotSent || rec.Holder != c.id) {\n",
			Replace: "\tif !in.ephemeral && rec.State == persist.StateNotSent {\n",
			Pkg:     root, Run: "^TestAChangedCartNeverReplacesAnIntentAnotherClientIsSending$",
		},
		{
			Name: "replace-what-another-holds", File: "intent.go",
			Note:    "a changed cart replaces an armed intent that another Client took over",
			Anchor:  "\treturn rec.State == persist.StateNotSent || rec.Holder == c.id\n",
			Replace: "\treturn true\n",
			Pkg:     root, Run: "^TestAChangedCartNeverReplacesAnIntentAnotherClientIsSending$",
		},
		{
			Name: "not-sent-over-a-take-over", File: "do.go",
			Note:    "a Client records not sent an intent another Client took over and is sending",
			Anchor:  "\tif saveErr := c.saveIf(context.WithoutCancel(ctx), in, rec, prev, \"record not sent\"); saveErr != nil {\n",
			Replace: "\tif saveErr := c.save(context.WithoutCancel(ctx), in, rec, \"record not sent\"); saveErr != nil && prev != nil {\n",
			Pkg:     root, Run: "^TestAnIntentAnotherClientTookOverIsNeverRecordedNotSent$",
		},
		{
			Name: "answer-not-marked-unrecorded", File: "do.go",
			Note:    "an answer whose save failed is returned without saying so",
			Anchor:  "\t\tresp.NotRecorded = true\n",
			Replace: "\t\t_ = resp\n",
			Pkg:     root, Run: "^TestAnAnswerWhoseSaveFailedIsReturnedAsNotRecorded$",
		},
		{
			Name: "pay-reports-answer-as-storage-error", File: "mobile/result.go",
			Note:    "the facade reports an answer whose save failed as a storage error",
			Anchor:  "\tif resp != nil && resp.NotRecorded {\n",
			Replace: "\tif false {\n",
			Pkg:     "./mobile", Run: "^TestPayReturnsAnAnswerWhoseSaveFailedAndSaysSo$",
		},
		{
			Name: "lookup-takes-client-policy", File: "reconcile.go",
			Note:    "the lookup is bounded by the Client's retry policy, not the call's",
			Anchor:  "c.policyFor(ctx).MaxElapsed)",
			Replace: "c.policy.MaxElapsed)",
			Pkg:     root, Run: "^TestTheLookupTakesTheCallsRetryPolicy$",
		},
		{
			Name: "cap-unjittered", File: "retry.go",
			Note:    "a wait over MaxInterval is clamped onto it",
			Anchor:  "\t\twait = time.Duration((1 - rand.Float64()*b.policy.Jitter) * float64(b.policy.MaxInterval))\n",
			Replace: "\t\twait = b.policy.MaxInterval\n",
			Pkg:     root, Run: "^TestWaitsAtTheCapAreJittered$",
		},
		{
			Name: "hook-misses-canceled-attempt", File: "call.go",
			Note:    "the attempt hook is not told of an attempt the caller's cancel cut short",
			Anchor:  "\t\tif st.b.attempts > 0 && st.canceled != st.b.attempts {\n",
			Replace: "\t\tif false {\n",
			Pkg:     root, Run: "^TestTheAttemptHookHearsOfAnAttemptCutShortByCancellation$",
		},
		{
			Name: "redirected-key-reuse-final", File: "call.go",
			Note:    "a key reuse answer after a redirect to another URL is taken for \"not paid\"",
			Anchor:  "\treturn st.redirectedKeyReuse(resp, body)\n",
			Replace: "\treturn nil\n",
			Pkg:     root, Run: "^TestAKeyReuseAnswerAfterARedirectToAnotherURLLeavesTheOutcomeUnknown$",
		},
		{
			Name: "redirect-forgotten-by-the-next-call", File: "do.go",
			Note:    "a redirect to another URL is forgotten once its call ends",
			Anchor:  "unsent: unsent, redirected: rec.Redirected,",
			Replace: "unsent: unsent, redirected: false,",
			Pkg:     root, Run: "^TestARedirectToAnotherURLIsRememberedAcrossARestart$",
		},
		{
			Name: "credential-name-joined-otherwise", File: "validate.go",
			Note:    "a credential's field name joined with an underscore or a dot (X-Api_Key) may be stored on the device",
			Anchor:  "if r == '-' || r == '_' || r == '.' {",
			Replace: "if r == '-' {",
			Pkg:     root, Run: "^TestServerStoredHeadersRefusesCredentialsSpelledAnyWay$",
		},
		{
			Name: "largest-limit-reads-nothing", File: "response.go",
			Note:    "a MaxResponseBytes of math.MaxInt64 wraps the read bound to nothing: an answer with no header field reads empty",
			Anchor:  "\tif bound < math.MaxInt64 {\n",
			Replace: "\tif bound < math.MaxInt64 || true {\n",
			Pkg:     root, Run: "^TestServerMaxResponseBytesAtItsLargestKeepsEveryBody$",
		},
		{
			Name: "expiry-unsaved-after-cancel", File: "do.go",
			Note:    "an intent found expired by a call whose context ended is reported canceled and stays pending",
			Anchor:  "c.save(context.WithoutCancel(ctx), in, rec, \"record expiry\")",
			Replace: "c.save(ctx, in, rec, \"record expiry\")",
			Pkg:     root, Run: "^TestExpiryIsSavedAfterACancel$",
		},
		{
			Name: "lookup-query-unchecked", File: "server.go",
			Note:    "a LookupQuery that is not a parameter's name (\"idempotency_key=\", \"?k\") is accepted, and every lookup misses",
			Anchor:  "if err := checkLookupQuery(s.LookupQuery); err != nil {",
			Replace: "if err := error(nil); err != nil {",
			Pkg:     root, Run: "^TestServerLookupQueryMustBeAParameterName$",
		},
		{
			Name: "replaced-server-still-refused", File: "server.go",
			Note:    "what an earlier WithServer got wrong is refused after a later one replaced it",
			Anchor:  "\t\tc.lookupInvalid = nil\n",
			Replace: "",
			Pkg:     root, Run: "^TestALaterWithServerReplacesAnEarlierOneWhole$",
		},
		{
			Name: "mobile-millis-wrap", File: "mobile/config.go",
			Note:    "a Config's milliseconds past a time.Duration are taken, and wrap around (a budget of Long.MAX_VALUE, a retention of centuries)",
			Anchor:  "\t\tcase *f.v > f.max:\n",
			Replace: "\t\tcase false:\n",
			Pkg:     "./mobile", Run: "^TestOpenRefusesABadConfig$",
		},
		{
			Name: "budget-cut-as-deadline", File: "call.go",
			Note:    "an attempt that MaxElapsed cut short leaves a *RetryError that matches context.DeadlineExceeded, as if the caller's deadline ended the call",
			Anchor:  "st.last, st.lastErr, st.stopped = nil, &budgetSpent{reason: st.cut.reason, err: redactErr(err)}, st.cut",
			Replace: "st.last, st.lastErr, st.stopped = nil, redactErr(err), st.cut",
			Pkg:     root, Run: "^TestMaxElapsedBoundsAnAttemptThatGetsNoAnswer$",
		},
		{
			Name: "lookup-budget-as-deadline", File: "reconcile.go",
			Note:    "a lookup that MaxElapsed cut short matches context.DeadlineExceeded, as if the caller's deadline ended it",
			Anchor:  "\t\t\treturn &budgetSpent{reason: stopElapsed, err: err}\n",
			Replace: "\t\t\treturn err\n",
			Pkg:     root, Run: "^TestReconcileLookupIsBoundedByMaxElapsed$",
		},
		{
			Name: "cancel-never-spent", File: "mobile/cancel.go",
			Note:    "a Cancel that stopped one call stops every later call it is passed to",
			Anchor:  "c.stop, c.canceled = nil, false",
			Replace: "c.stop = nil",
			Pkg:     "./mobile", Run: "^TestACancelIsSpentByTheCallItStopped$",
		},
		{
			Name: "oversized-lookup-never-settles", File: "reconcile.go",
			Note:    "a lookup's answer over MaxResponseBytes leaves the outcome unknown, and asking again gets the same answer",
			Anchor:  "readBody(resp.Body, limit); errors.Is(err, errBodyTooLarge) {",
			Replace: "readBody(resp.Body, limit); false {",
			Pkg:     root, Run: "^TestALookupAnswerOverTheLimitSettlesTheIntentWithoutItsBody$",
		},
		{
			Name: "retry-error-names-credentials", File: "call.go",
			Note:    "the *RetryError (and the not-sent error made from it) names the intent's URL with its user name and credential query values",
			Anchor:  "Err: redactErr(err),",
			Replace: "Err: err,",
			Pkg:     root, Run: "^TestErrorTextsCarryNoCredential$",
		},
		{
			Name: "api-error-names-credentials", File: "answer.go",
			Note:    "an *APIError's text names the intent's URL with its password",
			Anchor:  "e.Method, redactUserinfo(e.URL, true), e.StatusCode",
			Replace: "e.Method, e.URL, e.StatusCode",
			Pkg:     root, Run: "^TestErrorTextsCarryNoCredential$",
		},
		{
			Name: "lookup-error-names-credentials", File: "reconcile.go",
			Note:    "a failed lookup's error names the intent's URL with its user name and credential query values",
			Anchor:  "\t\terr = redactErr(err)\n",
			Replace: "",
			Pkg:     root, Run: "^TestErrorTextsCarryNoCredential$",
		},
		{
			Name: "key-header-stored", File: "validate.go",
			Note:    "a header field named for a key (Ocp-Apim-Subscription-Key) may be stored on the device",
			Anchor:  `if strings.HasSuffix(joined, "key") && joined != "idempotencykey" {`,
			Replace: `if false {`,
			Pkg:     root, Run: "^TestServerStoredHeadersRefusesCredentialsSpelledAnyWay$",
		},
		{
			Name: "request-error-names-credentials", File: "request.go",
			Note:    "a refused request's error names its URL with the user name and credential query values",
			Anchor:  "\tshown := redactUserinfo(r.URL, true)\n",
			Replace: "\tshown := r.URL\n",
			Pkg:     root, Run: "^TestErrorTextsCarryNoCredential$",
		},
	})
}
