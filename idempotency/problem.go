package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemBase prefixes every problem type URI of the contract.
const ProblemBase = "https://idem.dev/problems/"

// Problem types the middleware answers with. Clients match on these.
const (
	TypeKeyMissing        = ProblemBase + "idempotency-key-missing"
	TypeKeyInvalid        = ProblemBase + "idempotency-key-invalid"
	TypeKeyReused         = ProblemBase + "idempotency-key-reused"
	TypeRequestInProgress = ProblemBase + "request-in-progress"
	TypePayloadTooLarge   = ProblemBase + "payload-too-large"
	TypeBadRequest        = ProblemBase + "bad-request"
	TypeInternal          = ProblemBase + "internal-error"
	TypeStorageFull       = ProblemBase + "storage-full"
	// TypeKeyUnused is the lookup's miss (404): nothing was done under
	// this key for this caller, and nothing under it is in progress. It
	// is distinct from every other 404 (a wrong path, a proxy's own
	// page), which say nothing about the key; a client voids an intent
	// only on this type.
	TypeKeyUnused = ProblemBase + "idempotency-key-unused"
)

// Problem is an RFC 9457 problem details object. A Problem is a value; it is
// safe for concurrent use once built.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Write answers p as application/problem+json with status p.Status.
func (p *Problem) Write(w http.ResponseWriter) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: every field is a string or an int
		body = []byte(`{"title":"Internal Server Error","status":500}`)
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
