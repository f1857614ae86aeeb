package contractcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// The fault hook (docs/IDEMCHECK.md, "The fault hook"): the fake
// server's admin endpoints (docs/FAKESERVER.md), or a real server's hook
// that speaks their protocol, as examples/server's does. The fault rows
// use it to make the server fail on purpose.

// adminStats are the counters of GET /_fake/stats that the checks read.
type adminStats struct {
	Payments        *int `json:"payments"`
	ProviderCharges *int `json:"provider_charges"`
}

// useAdmin probes the admin endpoints once and reports whether the fault
// rows can run; reason says why not.
func (c *checker) useAdmin(ctx context.Context) (ok bool, reason string) {
	if c.adminChecked {
		return c.adminUsable, c.adminReason
	}
	c.adminChecked = true
	if c.cfg.admin == "" {
		c.adminReason = "the fault hook is off (-admin off)"
		return false, c.adminReason
	}
	_, ex := c.stats(ctx)
	switch {
	case !ex.answered():
		c.adminReason = fmt.Sprintf("no fault hook: GET %sstats got no answer (%v)", c.cfg.admin, ex.err)
	case ex.status != http.StatusOK:
		c.adminReason = fmt.Sprintf("no fault hook: GET %sstats answered %d", c.cfg.admin, ex.status)
	default:
		var st adminStats
		if json.Unmarshal(ex.body, &st) != nil || st.Payments == nil || st.ProviderCharges == nil {
			c.adminReason = fmt.Sprintf("no fault hook: GET %sstats is not the hook's counts", c.cfg.admin)
		} else {
			c.adminUsable = true
		}
	}
	if !c.adminUsable {
		c.adminReason += "; a server that offers one is named by -admin URL (docs/IDEMCHECK.md, \"The fault hook\")"
	}
	return c.adminUsable, c.adminReason
}

// stats reads GET /_fake/stats; st is nil when it cannot be read.
func (c *checker) stats(ctx context.Context) (*adminStats, *exchange) {
	ex := c.send(ctx, request{method: http.MethodGet, url: c.cfg.admin + "stats"})
	var st adminStats
	if !ex.ok() || json.Unmarshal(ex.body, &st) != nil || st.Payments == nil || st.ProviderCharges == nil {
		return nil, ex
	}
	return &st, ex
}

// fault is the body of POST /_fake/faults.
type fault struct {
	Fault   string `json:"fault"`
	Key     string `json:"key"`
	DelayMS int64  `json:"delay_ms,omitempty"`
}

// inject injects a fault for one key; it returns the exchange and whether
// the server took it (201).
func (c *checker) inject(ctx context.Context, f fault) (*exchange, bool) {
	body, _ := json.Marshal(f)
	ex := c.send(ctx, request{method: http.MethodPost, url: c.cfg.admin + "faults", body: body})
	return ex, ex.answered() && ex.status == http.StatusCreated
}

// injectFor is inject for a row: it returns a SKIP row when the endpoint
// refused the fault.
func (c *checker) injectFor(ctx context.Context, f fault) *Row {
	if ex, ok := c.inject(ctx, f); !ok {
		return &Row{Status: Skip, Detail: fmt.Sprintf("the fault hook did not take the %s fault: %s",
			f.Fault, ex.describeResponse()), Evidence: evidence(ex)}
	}
	return nil
}
