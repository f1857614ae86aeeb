package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// problemBase prefixes every problem type URI of the contract.
const problemBase = "https://idem.dev/problems/"

// The problem types the middleware answers with, as docs/CONTRACT.md lists
// them. Clients match on these. A server's own lookup answers its miss
// with https://idem.dev/problems/idempotency-key-unused ([MarkLookup]).
const (
	typeKeyMissing        = problemBase + "idempotency-key-missing"
	typeKeyInvalid        = problemBase + "idempotency-key-invalid"
	typeKeyReused         = problemBase + "idempotency-key-reused"
	typeRequestInProgress = problemBase + "request-in-progress"
	typePayloadTooLarge   = problemBase + "payload-too-large"
	typeBadRequest        = problemBase + "bad-request"
	// typeRequestIncomplete is a 408. The body ended before its declared
	// length, or its connection broke while it was read.
	typeRequestIncomplete = problemBase + "request-incomplete"
	typeInternal          = problemBase + "internal-error"
	typeStorageFull       = problemBase + "storage-full"
	// typeUnsupportedMediaType is a 415. It answers a Content-Encoding
	// the middleware does not decode. It also answers a JSON body in a
	// charset other than UTF-8.
	typeUnsupportedMediaType = problemBase + "unsupported-media-type"
)

// Problem is an RFC 9457 problem details object. A Problem is a value. It
// is safe for concurrent use once built.
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
