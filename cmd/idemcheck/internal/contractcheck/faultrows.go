package contractcheck

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// The fault rows: they make the server fail on purpose through its fault
// hook (the fake server's admin endpoints, or a real server's hook that
// speaks their protocol), and are SKIP on a server without one.

func (c *checker) row5xx(ctx context.Context) Row {
	if ok, reason := c.useAdmin(ctx); !ok {
		return skip("%s", reason)
	}
	k := c.cfg.NewKey()
	if r := c.injectFor(ctx, fault{Fault: "error", Key: k}); r != nil {
		return *r
	}
	failed := c.post(ctx, c.cfg.Body, k)
	if !failed.answered() || failed.status < 500 {
		return fail("the error fault did not make the request fail with a 5xx", failed)
	}
	retry := c.post(ctx, c.cfg.Body, k)
	if !retry.ok() {
		return fail(fmt.Sprintf("after a %d, the retry with the same key was not done: the 5xx was stored", failed.status), failed, retry)
	}
	c.fresh = append(c.fresh, retry)
	return pass("%d, then the retry was done (%d)", failed.status, retry.status)
}

// maxWaits is how many waits the dead-worker row makes at most within
// leaseWait: each wait doubles from 1s, or is longer when Retry-After asks.
func maxWaits(leaseWait time.Duration) int {
	n := 0
	for waited, d := time.Duration(0), time.Second; waited < leaseWait; d *= 2 {
		waited += min(d, leaseWait-waited)
		n++
	}
	return n
}

func (c *checker) rowDeadWorker(ctx context.Context) Row {
	if ok, reason := c.useAdmin(ctx); !ok {
		return skip("%s", reason)
	}
	before, sx := c.stats(ctx)
	if before == nil {
		return fail("GET stats of the fault hook failed", sx)
	}
	k := c.cfg.NewKey()
	if r := c.injectFor(ctx, fault{Fault: "crash_after_provider", Key: k}); r != nil {
		return *r
	}
	crash := c.post(ctx, c.cfg.Body, k)
	if crash.ok() {
		return fail("the crash_after_provider fault did not stop the worker: it answered", crash)
	}
	first := c.post(ctx, c.cfg.Body, k)
	if !first.ok() && (!first.answered() || first.status != http.StatusConflict) {
		return fail("right after the worker died, a retry got neither 409 (its lease lives) nor 2xx (taken over)", crash, first)
	}
	last := first
	var waited time.Duration
	for d := time.Second; !last.ok(); d *= 2 {
		if !last.answered() || last.status != http.StatusConflict {
			return fail("while waiting for the lease to end, an answer other than 409 or 2xx", crash, first, last)
		}
		wait := d
		if secs, ok := last.retryAfter(); ok && time.Duration(secs)*time.Second > wait {
			wait = time.Duration(secs) * time.Second
		}
		if waited >= c.cfg.LeaseWait {
			return skip("the lease did not end within -lease-wait %v; give a longer one", c.cfg.LeaseWait)
		}
		wait = min(wait, c.cfg.LeaseWait-waited)
		if err := c.cfg.Sleep(ctx, wait); err != nil {
			return fail("interrupted while waiting for the lease: "+err.Error(), crash, first, last)
		}
		waited += wait
		last = c.post(ctx, c.cfg.Body, k)
	}
	after, sx := c.stats(ctx)
	if after == nil {
		return fail("GET stats of the fault hook failed", sx)
	}
	charges, payments := *after.ProviderCharges-*before.ProviderCharges, *after.Payments-*before.Payments
	if charges != 1 || payments != 1 {
		return fail(fmt.Sprintf("the takeover after %v left %d provider charges and %d payments, not 1 and 1", waited, charges, payments),
			crash, first, last, sx)
	}
	replay := c.post(ctx, c.cfg.Body, k)
	if !replay.ok() || replay.resource() != last.resource() {
		return fail("after the takeover, a retry did not get its answer", last, replay)
	}
	if first.ok() {
		// A server that keeps nothing of a worker that died before its
		// commit (one transaction per key) has no lease to wait out.
		return pass("the retry right after the crash was done: nothing of the dead worker was kept; 1 provider charge")
	}
	return pass("409 while the lease lived, taken over after %v, 1 provider charge", waited)
}
