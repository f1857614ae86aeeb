package fakeserver

import (
	"net/http"

	"github.com/idemkit/idem/idempotency"
)

// Problem type URIs of the fake server's RFC 9457 answers, as
// docs/CONTRACT.md lists them; the idempotency layer's own answers carry
// the same types (the tests check that they do). Clients match on these,
// never on titles or details. Besides [ProblemCardDeclined], the fake
// answers https://idem.dev/problems/validation-failed (400, the body is
// not a valid payment; the key stays free) and
// https://idem.dev/problems/injected-fault (the answers of the error and
// status faults).
const (
	// problemBase prefixes every problem type of the contract.
	problemBase = "https://idem.dev/problems/"
	// ProblemCardDeclined: 402, the provider declined the card (customer
	// cus_declined).
	ProblemCardDeclined = problemBase + "card-declined"
	// problemValidationFailed: 400, the body is not a valid payment; the key
	// stays free.
	problemValidationFailed = problemBase + "validation-failed"
	// problemInjectedFault is the type of answers made by the error and
	// status faults.
	problemInjectedFault = problemBase + "injected-fault"

	problemNotFound         = problemBase + "not-found"
	problemMethodNotAllowed = problemBase + "method-not-allowed"
	// problemUnavailable: the client went away while its payment was being
	// processed; nothing was stored.
	problemUnavailable = problemBase + "unavailable"

	// The types the idempotency layer answers with too, for the fake's
	// own answers of the same kind (its lookup, its orders, its bounds).
	problemKeyInvalid        = problemBase + "idempotency-key-invalid"
	problemKeyUnused         = problemBase + "idempotency-key-unused"
	problemRequestInProgress = problemBase + "request-in-progress"
	problemPayloadTooLarge   = problemBase + "payload-too-large"
	problemStorageFull       = problemBase + "storage-full"
	problemInternal          = problemBase + "internal-error"
)

// maxBodyBytes limits the bodies of every endpoint, as the idempotency
// layer is told to limit those of POST /payments.
const maxBodyBytes = 1 << 20

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
