package fakeserver

// NewBareHandler returns a Handler whose POST /payments runs the payment
// handler without the idempotency layer, as a server without the contract
// would: every request does the work and charges, a key is neither required
// nor remembered, and nothing is replayed. The rest of the API, faults and
// counters are those of NewHandler.
//
// It exists as the baseline that measures what the idempotency layer costs
// (cmd/idembench). Test clients against NewHandler, never against this.
// nil opts means defaults.
func NewBareHandler(opts *Options) *Handler { return newHandler(opts, true) }
