package fakeserver

import (
	"context"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// The names the tests use that are not part of the package's API.
var (
	AccountOf       = accountOf
	ErrUnknownFault = errUnknownFault
	ErrInvalidFault = errInvalidFault
)

const (
	MaxAccountLen           = maxAccountLen
	MaxStatusLen            = maxStatusLen
	MaxFaults               = maxFaults
	ProblemValidationFailed = problemValidationFailed
	ProblemInjectedFault    = problemInjectedFault

	// The contract's problem types, which the tests check the idempotency
	// layer's answers against as well as the fake's own.
	ProblemBase              = problemBase
	ProblemKeyInvalid        = problemKeyInvalid
	ProblemKeyUnused         = problemKeyUnused
	ProblemRequestInProgress = problemRequestInProgress
	ProblemPayloadTooLarge   = problemPayloadTooLarge
	ProblemStorageFull       = problemStorageFull
	ProblemInternal          = problemInternal
)

// Reset is what POST /_fake/reset does.
func Reset(h *Handler) { _ = h.reset(context.Background()) }

// LeaseUntil returns the end of the lease on the record of key, sent
// without credentials, or the zero time without a live record.
func LeaseUntil(h *Handler, key string) time.Time {
	rec, live, err := h.state.Record(context.Background(), idempotency.ID{Key: key}, h.cfg.now())
	if err != nil || !live {
		return time.Time{}
	}
	return rec.LockedUntil
}
