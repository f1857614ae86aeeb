package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// The real mode's app: each action is a checkout of one to three carts in
// turn. It pays each through Do, at times as a double tap, across kills.
// It may reconcile an intent it gave up on, and pay again under a new key
// when the server never did it.

// action runs one user action.
func (run *realRun) action(a *rAction, r *rand.Rand) {
	purchases := 1
	if r.IntN(3) == 0 {
		purchases += 1 + r.IntN(2)
	}
	for p := range purchases {
		if p > 0 && r.IntN(3) == 0 {
			run.jumpClock(r)
		}
		// A kill before the first Do armed the intent leaves nothing
		// stored: the app makes it again.
		ok, stored := false, false
		for try := 0; try < 20 && !stored; try++ {
			it, in, g := run.newIntent(a, p, a.cart(run.srv.URL, p), false, r)
			if it == nil {
				return // the previous purchase is unresolved: the app waits
			}
			ok, stored = run.drive(it, in, g, a, r, 0)
		}
		if !ok {
			return
		}
	}
}

// newIntent makes the intent for req with Client.Intent, or NewIntent to
// pay again after a void intent, and checks the unresolved guard: a new
// intent exists only while every earlier intent of its action is
// settled. It returns the intent as the app knows it, as the Client
// made it and the Client's generation, or nil when the guard refused.
func (run *realRun) newIntent(a *rAction, p int, req idem.Request, again bool, r *rand.Rand) (*rIntent, *idem.Intent, *generation) {
	for try := 0; ; try++ {
		if try == 20 {
			run.bad("action %d: no intent could be made in 20 generations", a.i)
			return nil, nil, nil
		}
		g := run.current()
		var (
			in  *idem.Intent
			err error
		)
		if again {
			in, err = g.client.NewIntent(g.ctx, a.name, req)
		} else {
			in, err = g.client.Intent(g.ctx, a.name, req)
			if errors.As(err, new(*idem.ResolvedError)) {
				// The last purchase succeeded: this one is a deliberate
				// new payment.
				in, err = g.client.NewIntent(g.ctx, a.name, req)
			}
		}
		switch {
		case g.killed(err):
			continue
		case errors.As(err, new(*idem.UnresolvedError)):
			run.count("app.refused-while-unresolved")
			return nil, nil, nil
		case err != nil:
			run.bad("action %d: %v", a.i, err)
			return nil, nil, nil
		}
		recs, err := g.store.List(g.ctx, persist.Filter{Name: a.name})
		if g.killed(err) {
			continue
		}
		if err != nil {
			run.bad("action %d: listing its intents: %v", a.i, err)
			return nil, nil, nil
		}
		for _, rec := range recs {
			if rec.Key != in.Key() && !rec.State.Resolved() && rec.State != persist.StateNotSent {
				run.bad("action %d: intent %s was made while intent %s (%s, created %s) was unresolved", a.i, in.Key(), rec.Key, rec.State, rec.CreatedAt)
			}
		}
		run.intentsMu.Lock()
		for _, other := range run.intents {
			if other.key == in.Key() {
				// The same cart's intent, returned again: a resumption.
				run.intentsMu.Unlock()
				return other, in, g
			}
		}
		it := &rIntent{i: a.i, p: p, req: req, declined: a.declined, key: in.Key()}
		run.intents = append(run.intents, it)
		run.intentsMu.Unlock()
		run.injectFaults(it, r)
		if r.IntN(4) == 0 {
			// The user leaves the Pay screen open: the first attempt goes
			// out minutes later.
			_ = run.clock.Sleep(context.Background(), time.Duration(r.IntN(600))*time.Second)
		}
		return it, in, g
	}
}

// drive makes up to three calls of Do for in, made by g, some of them
// double taps, across whatever kills happen. An intent left unresolved
// may then be reconciled, and paid again under a new intent when the
// server never did it. ok says whether the action may go on to its next
// purchase; stored, that the intent was stored: a kill before the first
// Do armed it leaves nothing to resume.
func (run *realRun) drive(it *rIntent, in *idem.Intent, g *generation, a *rAction, r *rand.Rand, depth int) (ok, stored bool) {
	const maxCalls = 3
	killedCalls := 0
	for call := 0; call < maxCalls; {
		if cur := run.current(); cur != g {
			// A restart: the new app loads the intent from the device.
			g = cur
			loaded, err := g.client.Load(g.ctx, it.key)
			switch {
			case g.killed(err):
				continue
			case errors.Is(err, persist.ErrNotFound):
				// Never armed: nothing of it was sent.
				it.unstored = true
				return false, false
			case err != nil:
				run.bad("intent %s: load: %v", it.key, err)
				return false, true
			}
			in = loaded
			if !in.State().Resolved() && r.IntN(2) == 0 {
				// The app looks the intent up before it resumes it.
				if done, ok := run.settle(g, it, in, r); ok {
					return !done, true
				}
				continue // a kill cut it short: start over from the device
			}
		}
		if in.State().Resolved() {
			return true, true
		}
		run.calls.Add(1)
		resp, err := run.doMaybeTwice(g, in, r)
		it.lastErr = err
		// A killed generation's goroutines may still return what its
		// memory holds; only what the device kept counts.
		final := resp != nil && (err == nil || isAPIError(err)) && g.ctx.Err() == nil
		if final {
			it.final = resp
			if !errors.As(err, new(*idem.SaveError)) {
				return true, true
			}
			// The answer could not be saved: the next Do replays it.
		}
		if g.killed(err) {
			// A killed call does not use up the intent's calls, but kills
			// cannot keep one intent going for ever.
			if killedCalls++; killedCalls > 20 {
				run.bad("intent %s: killed 20 times", it.key)
				return false, true
			}
			continue
		}
		if err != nil && !final && !errors.Is(err, idem.ErrOutcomeUnknown) {
			run.bad("intent %s: unexpected error: %v", it.key, err)
			return false, true
		}
		it.budgetOut = budgetRanOut(err)
		call++
	}
	if r.IntN(2) == 0 {
		return false, true // left for later: the check settles it
	}
	void, ok := run.settle(g, it, in, r)
	if !ok {
		return false, true
	}
	if void && depth < 2 {
		// The server never did it: the app pays again, under a new key.
		again, in, g := run.newIntent(a, it.p, it.req, true, r)
		if again == nil {
			return false, true
		}
		run.count("app.paid-again-after-void")
		ok, _ := run.drive(again, in, g, a, r, depth+1)
		return ok, true
	}
	return !void, true
}

// settle reconciles an unresolved intent as an app does: after a while,
// and again after the reconcile delay when the server cannot tell yet. ok
// says whether it concluded; void, that the server never did the work.
func (run *realRun) settle(g *generation, it *rIntent, in *idem.Intent, r *rand.Rand) (void, ok bool) {
	if run.wire.uncertain(it.key) {
		// A kill cut one of its round trips short: the request may sit
		// in a socket for a moment of real time, which the manual clock
		// does not measure. The check settles it at the end.
		return false, false
	}
	if r.IntN(3) == 0 {
		// The device's clock is set while the app waits for an answer.
		run.jumpClock(r)
	}
	_ = run.clock.Sleep(g.ctx, time.Duration(r.Int64N(int64(2*realReconcileDelay))))
	for range 2 {
		resp, err := g.client.Reconcile(g.ctx, in)
		switch {
		case g.killed(err):
			return false, false
		case errors.Is(err, idem.ErrOutcomeUnknown):
			_ = run.clock.Sleep(g.ctx, realReconcileDelay)
			continue
		case err != nil:
			run.bad("intent %s: reconcile: %v", it.key, err)
			return false, false
		}
		switch in.State() {
		case persist.StateSucceeded:
			it.final = resp
			return false, true
		case persist.StateVoid:
			return true, true
		}
		run.bad("intent %s: reconciled to %s", it.key, in.State())
		return false, false
	}
	it.leftUnknown = true
	return false, false
}

// doMaybeTwice calls Do, or, one time in six, two Do calls at once on the
// same intent (a double tap), which must agree.
func (run *realRun) doMaybeTwice(g *generation, in *idem.Intent, r *rand.Rand) (*idem.Response, error) {
	if r.IntN(6) != 0 {
		return g.client.Do(g.ctx, in)
	}
	run.doubleTaps.Add(1)
	var (
		wg    sync.WaitGroup
		resps [2]*idem.Response
		errs  [2]error
		early = r.IntN(2) == 0
	)
	for i := range 2 {
		wg.Go(func() {
			if i == 1 && !early {
				// The second tap a moment later, while the first may be
				// waiting or on the wire.
				time.Sleep(100 * time.Microsecond)
			}
			resps[i], errs[i] = g.client.Do(g.ctx, in)
		})
	}
	wg.Wait()
	if errs[0] == nil && errs[1] == nil && (resps[0].StatusCode != resps[1].StatusCode || string(resps[0].Body) != string(resps[1].Body)) {
		run.bad("intent %s: a double tap's calls disagree: %d %s and %d %s", in.Key(), resps[0].StatusCode, resps[0].Body, resps[1].StatusCode, resps[1].Body)
	}
	if errs[0] == nil || isAPIError(errs[0]) && resps[0] != nil {
		return resps[0], errs[0]
	}
	return resps[1], errs[1]
}

// budgetRanOut reports a call ended by its retry budget: attempts, time,
// the context's deadline, the Retry-After cap or the client-wide budget.
// (idem names the reasons in words, which RetryError.Reason gives.)
func budgetRanOut(err error) bool {
	var re *idem.RetryError
	if !errors.As(err, &re) {
		return false
	}
	switch re.Reason {
	case "max attempts reached", "max elapsed time reached", "context deadline", "Retry-After above the cap", "client-wide retry budget spent":
		return true
	}
	return false
}

func isAPIError(err error) bool { return errors.As(err, new(*idem.APIError)) }
