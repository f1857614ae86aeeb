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
		Anchor: `		existing, inserted, err := m.cfg.Store.Insert(ctx, rec)
`,
		Replace: `		var absent bool
		if g, ok := m.cfg.Store.(interface {
			Get(context.Context, ID, time.Time) (*Record, bool)
		}); ok {
			_, found := g.Get(ctx, rec.ID, now)
			absent = !found
		}
		existing, inserted, err := m.cfg.Store.Insert(ctx, rec)
		inserted = inserted || absent && err == nil
`,
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "reconcile-delay-from-creation", File: "reconcile.go",
		Note:    "a 404 is trusted once the intent is older than the reconcile delay, whenever its last attempt left",
		Anchor:  "		return c.keys.mayStillArrive(key, c.clocks.read(), c.clocks.birth, c.reconcile, cur, c.id)\n",
		Replace: "		return max(c.reconcile-c.clock.Now().Sub(cur.CreatedAt), 0)\n",
	},
	// 5xx-final is the root package's: no unmarked answer settles an
	// intent, so the simulation's proxies' 520-524 end unknown whatever
	// their status; TestAnswer/"every server error is an unknown outcome" holds the rule.
	{
		Pkg: simPkg, Run: simRun,
		Name: "intent-saved-when-shown", File: "action.go",
		Note:    "an intent is saved when the Pay screen shows it, so a restart settles a cart nobody tapped",
		Anchor:  "\tin.rec, in.unsent, in.unarmed, in.force, in.after = &made.rec, c.keys, true, forceNew, revOf(latest)\n",
		Replace: "\tin.rec, in.unsent, in.unarmed, in.force, in.after = &made.rec, c.keys, true, forceNew, revOf(latest)\n\tmade.rec.Rev = persist.NewRev()\n\tif err := persist.Claim(ctx, c.store, &made.rec); err != nil {\n\t\treturn nil, err\n\t}\n",
	},
	// settle-all-trusts-its-list is the root package's: in the simulated
	// world, which runs one step at a time, every intent SettleAll lists
	// was armed by an earlier process and may have been sent, so no tap
	// makes it "not sent" after the list; the race needs a tap in flight
	// as SettleAll lists. TestSettleAll holds the rule, with another
	// Client too.
	{
		Pkg: simPkg, Run: simRun,
		Name: "key-spelling-from-option", File: "call.go",
		Note:    "the key is spelled as the current Client's option says, not as stored with the intent",
		Anchor:  "\tst.keyValue[0] = rec.KeyHeader\n",
		Replace: "\tst.keyValue[0] = cfg.keyHeader(rec.Key)\n",
	},
	// redirect-answer-is-outcome is the root package's: the login page
	// that the followed GET reaches does not echo the key, so in the
	// simulation the client leaves the outcome unknown on it anyway.

	// Only the server's word settles an intent.
	{
		Pkg: simPkg, Run: simRun,
		Name: "lookup-bare-404-voids", File: "reconcile.go",
		Note:    "any 404 of the lookup voids the intent, a CDN's or an ingress's own page too (lookup.proxy-404)",
		Anchor:  "case !reflected(resp.Header) && (isKeyUnused(resp.StatusCode, resp.Header, body) ||",
		Replace: "case (resp.StatusCode == http.StatusNotFound ||",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "lookup-echo-alone-voids", File: "reconcile.go",
		Note:    "a lookup's 404 that echoes the key voids the intent without the typed miss (lookup.reflecting-gateway)",
		Anchor:  "case !reflected(resp.Header) && (isKeyUnused(resp.StatusCode, resp.Header, body) ||",
		Replace: "case (resp.StatusCode == http.StatusNotFound && echoes(resp.Header, key) ||",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "lookup-unmarked-2xx-succeeds", File: "reconcile.go",
		Note:    "a lookup's 2xx without the echo makes the intent succeeded (lookup.fallback-200)",
		Anchor:  "case isSuccess(resp.StatusCode) && c.lookupTrusted(resp.StatusCode, resp.Header, body, key, nonce):",
		Replace: "case isSuccess(resp.StatusCode):",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "unmarked-4xx-final", File: "call.go",
		Note:    "an unmarked 4xx after an attempt that may have charged is stored as final (proxy.refuse-post)",
		Anchor:  "\tif st.own {\n\t\treturn nil\n\t}\n\tst.stopped = &stop{reason: stopUnmarked}",
		Replace: "\tif st.own || !isSuccess(resp.StatusCode) {\n\t\treturn nil\n\t}\n\tst.stopped = &stop{reason: stopUnmarked}",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "unmarked-2xx-final", File: "call.go",
		Note:    "an unmarked 2xx answer to a send is the payment (a captive portal's login page, proxy.refuse-post)",
		Anchor:  "\tif st.own {\n\t\treturn nil\n\t}\n\tst.stopped = &stop{reason: stopUnmarked}",
		Replace: "\tif st.own || isSuccess(resp.StatusCode) {\n\t\treturn nil\n\t}\n\tst.stopped = &stop{reason: stopUnmarked}",
	},
	// Not sent means not sent.
	{
		Pkg: simPkg, Run: simRun,
		Name: "dial-errors-unknown", File: "call.go",
		Note:    "a call none of whose requests left the device ends with the outcome unknown (device.offline)",
		Anchor:  "return !st.unproven && st.wrote.Load() == 0",
		Replace: "return false && !st.unproven && st.wrote.Load() == 0",
	},
	// A device's life.
	{
		Pkg: simPkg, Run: simRun,
		Name: "not-sent-unsaved-told-not-sent", File: "life.go",
		Note:    "a call whose not-sent write failed tells the app \"not sent\", and the next start sends it",
		Anchor:  "\t\t\treturn retryErr\n\t\t}\n\t\treturn errors.Join(retryErr, saveErr)\n",
		Replace: "\t\t\treturn retryErr\n\t\t}\n\t\treturn errors.Join(err, saveErr)\n",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "claim-without-check", File: "persist/claim.go",
		Note:    "the store's claim of an action's latest intent saves whatever the action holds (device.two-clients)",
		Anchor:  "\tif !lost {\n",
		Replace: "\tif true || !lost {\n",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "answer-not-marked-unrecorded", File: "life.go",
		Note:    "an answer whose save failed is returned without saying so (device.save-after-answer)",
		Anchor:  "\t\tresp.NotRecorded = true\n",
		Replace: "\t\t_ = resp\n",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "prune-without-tombstone", File: "prune.go",
		Note:    "Prune deletes an action's latest paid intent like any other",
		Anchor:  "\t\tcase keep[r.Key]:\n",
		Replace: "\t\tcase false:\n",
	},
	// roundtripper-callers-key-ageless is the root package's too: the
	// default seeds, and those that reached it once, no longer do.
	{
		Pkg: simPkg, Run: simRun,
		Name: "paid-action-pays-again", File: "action.go",
		Note:    "a changed request for an action that succeeded makes a new intent",
		Anchor:  "\t\t\tcase latest.State == persist.StateSucceeded && !forceNew:\n\t\t\t\treturn nil, &ResolvedError{Name: name, Previous: c.intentOf(latest)}\n",
		Replace: "",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "age-ignores-sleep", File: "age.go",
		Note:    "an intent's age ignores the clock that counts device sleep (phones sleeping through waits)",
		Anchor:  "\t\tage = max(age, r.boot-cl.Armed)\n",
		Replace: "\t\t_ = cl\n",
	},
	// lookup-cached-miss-trusted: since the simulation serves the fake
	// server's own handler, its default seeds no longer reach a cached miss
	// that voids a charged intent. The root's lookup test holds the rule.
	{
		Pkg: ".", Run: "^TestLookup$/^a_miss_a_cache_kept_never_voids_a_charged_intent$",
		Name: "lookup-cached-miss-trusted", File: "reconcile.go",
		Note:    "a lookup's miss that a CDN kept from before the payment voids the intent (lookup.caching-cdn)",
		Anchor:  "\t\tif !echoesNonce(resp.Header, nonce) {\n",
		Replace: "\t\tif false && !echoesNonce(resp.Header, nonce) {\n",
	},
	// fake-provider-charges-twice: a worker whose lease ended in its delay
	// now dies before the work, so the simulation no longer makes the
	// provider see one stable id twice. The provider's own test holds it.
	{
		Pkg: "./fakeserver", Run: "^TestProviderIsIdempotentOnStableID$",
		Name: "fake-provider-charges-twice", File: "fakeserver/provider.go",
		Note:    "the fake server's provider charges a stable id again, so a slow worker and its takeover pay twice",
		Anchor:  "if old, ok := p.charges[c.ID]; ok {",
		Replace: "if old, ok := p.charges[c.ID]; ok && false {",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "see-other-failed", File: "answer.go",
		Note:    "the server's 303 See Other to the payment it made is stored as failed (server.see-other)",
		Anchor:  "\tcase done(status):\n",
		Replace: "\tcase isSuccess(status):\n",
	},
	{
		Pkg: simPkg, Run: simRun,
		Name: "authorizer-failure-not-sent", File: "call.go",
		Note:    "an Authorizer that fails on a later attempt ends the call \"not sent\", though an earlier attempt was written (app.authorizer-fails)",
		Anchor:  "return !st.unproven && st.wrote.Load() == 0 && st.answers.Load() == 0 && st.conns.Load() == 0",
		Replace: "return st.authErr != nil || !st.unproven && st.wrote.Load() == 0 && st.answers.Load() == 0 && st.conns.Load() == 0",
	},
	// hand-out-not-marked is the root package's (handed-out-not-marked):
	// the simulation's default seeds do not reach a lookup between a
	// hand-out and the app's late send.
	{
		Pkg: simPkg, Run: simRun,
		Name: "hand-out-past-expiry", File: "handout.go",
		Note:    "an intent too old to send is handed out, and the server, which forgot its key, charges it again (app.hand-out)",
		Anchor:  "\tif cur.State == persist.StateExpired || cur.State != persist.StateNotSent && c.left(cur) <= 0 {\n",
		Replace: "\tif false {\n",
	},
	// prune-by-wall-clock and age-ignores-wall-mark are the root
	// package's: the tombstone keeps what a paid action needs whatever
	// Prune's age says, and the world's devices never reboot, so the
	// clock that counts sleep covers a wall clock set back.
}

// The simulation in its default budget: it stops at the first seed that
// breaks an invariant.
const simPkg, simRun = "./internal/sim", "^TestSimulation$/^virtual$"

// TestMutants requires the simulation to kill each of mutants, and to
// pass without them.
func TestMutants(t *testing.T) { mutant.Test(t, mutants) }
