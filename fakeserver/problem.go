package fakeserver

import (
	"net/http"

	"github.com/idemkit/idem/idempotency"
)

// Problem type URIs of the fake server's own RFC 9457 answers; those of the
// idempotency layer are the idempotency package's (idempotency.TypeKeyReused,
// idempotency.TypeStorageFull, ...). Clients match on these, never on titles
// or details. Besides [ProblemCardDeclined], the fake answers
// https://idem.dev/problems/validation-failed (400, the body is not a valid
// payment; the key stays free) and https://idem.dev/problems/injected-fault
// (the answers of the error and status faults).
const (
	// ProblemCardDeclined: 402, the provider declined the card (customer
	// cus_declined).
	ProblemCardDeclined = idempotency.ProblemBase + "card-declined"
	// problemValidationFailed: 400, the body is not a valid payment; the key
	// stays free.
	problemValidationFailed = idempotency.ProblemBase + "validation-failed"
	// problemInjectedFault is the type of answers made by the error and
	// status faults.
	problemInjectedFault = idempotency.ProblemBase + "injected-fault"

	problemNotFound         = idempotency.ProblemBase + "not-found"
	problemMethodNotAllowed = idempotency.ProblemBase + "method-not-allowed"
	// problemUnavailable: the client went away while its payment was being
	// processed; nothing was stored.
	problemUnavailable = idempotency.ProblemBase + "unavailable"
)

type problem = idempotency.Problem

func validationProblem(detail string) *problem {
	return &problem{Type: problemValidationFailed, Title: "Validation failed", Status: http.StatusBadRequest, Detail: detail}
}

func notFound(detail string) *problem {
	return &problem{Type: problemNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: detail}
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	(&problem{Type: problemMethodNotAllowed, Title: "Method not allowed", Status: http.StatusMethodNotAllowed,
		Detail: "allowed methods: " + allow}).Write(w)
}
