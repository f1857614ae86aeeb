package fakeserver

import (
	"net/http"

	"github.com/idemkit/idem/idempotency"
)

// Problem type URIs of the fake server's RFC 9457 answers. Clients match on
// these, never on titles or details.
const (
	ProblemBase              = idempotency.ProblemBase
	ProblemKeyMissing        = idempotency.TypeKeyMissing
	ProblemKeyInvalid        = idempotency.TypeKeyInvalid
	ProblemKeyReused         = idempotency.TypeKeyReused
	ProblemRequestInProgress = idempotency.TypeRequestInProgress
	ProblemPayloadTooLarge   = idempotency.TypePayloadTooLarge
	// ProblemBadRequest: the body could not be read, or is JSON without one
	// reading (nested too deep, or member names equal after case folding).
	ProblemBadRequest = idempotency.TypeBadRequest
	// ProblemStorageFull: the server holds as many records or payments as
	// it may (503); nothing was stored or charged.
	ProblemStorageFull      = idempotency.TypeStorageFull
	ProblemInternal         = idempotency.TypeInternal
	ProblemCardDeclined     = ProblemBase + "card-declined"
	ProblemValidationFailed = ProblemBase + "validation-failed"
	ProblemNotFound         = ProblemBase + "not-found"
	ProblemMethodNotAllowed = ProblemBase + "method-not-allowed"
	// ProblemInjectedFault is the type of answers made by the error and
	// status faults.
	ProblemInjectedFault = ProblemBase + "injected-fault"
	// ProblemUnavailable: the client went away while its payment was being
	// processed; nothing was stored.
	ProblemUnavailable = ProblemBase + "unavailable"
)

// Problem is an RFC 9457 problem details body, as the fake server sends it.
type Problem = idempotency.Problem

func validationProblem(detail string) *Problem {
	return &Problem{Type: ProblemValidationFailed, Title: "Validation failed", Status: http.StatusBadRequest, Detail: detail}
}

func notFound(detail string) *Problem {
	return &Problem{Type: ProblemNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: detail}
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	(&Problem{Type: ProblemMethodNotAllowed, Title: "Method not allowed", Status: http.StatusMethodNotAllowed,
		Detail: "allowed methods: " + allow}).Write(w)
}
