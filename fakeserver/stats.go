package fakeserver

import "context"

// Stats are the fake server's counters, for tests to assert on. Stats is a
// value.
type Stats struct {
	// Payments counts successful payments made (committed).
	Payments int `json:"payments"`
	// ProviderCharges counts charges the fake provider made.
	ProviderCharges int `json:"provider_charges"`
	// Executions counts how often the payment handler, or the handler of
	// a POST or PATCH [Endpoint], ran its work: once per fresh request or
	// takeover, never for a replay, a 409 or a 400.
	Executions int `json:"executions"`
	// Records counts stored idempotency records, expired ones included until
	// swept.
	Records int `json:"records"`
	// InProgress counts records IN_PROGRESS.
	InProgress int `json:"in_progress"`
	// Requests counts requests to the business API (admin endpoints are not
	// counted), faulted ones included.
	Requests int `json:"requests"`
}

// Stats returns the counters now. On shared storage they are its totals,
// for every server on it (zero if it cannot be read).
func (h *Handler) Stats() Stats {
	st, _ := h.stats(context.Background())
	return st
}

func (h *Handler) stats(ctx context.Context) (Stats, error) {
	st, err := h.state.Stats(ctx)
	return Stats(st), err
}
