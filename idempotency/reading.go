package idempotency

import (
	"bytes"
	"net/http"

	"github.com/idemkit/idem/idempotency/internal/canonjson"
)

// JSONReading is a JSON request body as the fingerprint read it. A
// [Config.Validate] hook gets it from [JSONReadingOf]. The fingerprint
// and the validation then parse the body once between them.
type JSONReading interface {
	// Len returns the number of members of the body's object. It returns
	// -1 when the body is not one JSON object.
	Len() int
	// Member returns the object's member i (0 <= i < Len()), in the
	// fingerprint's canonical order. The name is decoded as encoding/json
	// decodes it. The value is its token as written. That is a string with
	// its quotes and escapes, a number, true, false or null. For an object
	// or an array, it is the opening bracket only. The names of one object
	// are distinct even after encoding/json's case folding. The middleware
	// refuses other bodies.
	Member(i int) (name, value []byte)
}

// JSONReadingOf returns the fingerprint's reading of r's body while r is
// in [Config.Validate]. It returns false outside Validate. It also
// returns false for a body that is not JSON. The reading's memory is
// reused once Validate returns. So a hook must not keep the reading, or
// the bytes it returned.
func JSONReadingOf(r *http.Request) (JSONReading, bool) {
	b, ok := r.Body.(*validateBody)
	if !ok || b.reading == nil {
		return nil, false
	}
	return b.reading, true
}

// validateBody is the request body the middleware hands Config.Validate.
// It holds the body's bytes. While the hook runs, it also holds the
// fingerprint's reading of them.
type validateBody struct {
	bytes.Reader
	reading JSONReading
}

// newValidateBody returns a body reading b, carrying c. c is nil for a
// body that is not JSON.
func newValidateBody(b []byte, c *canonjson.Value) *validateBody {
	body := &validateBody{}
	if c != nil {
		body.reading = c
	}
	body.Reader.Reset(b)
	return body
}

// Close does nothing, since the bytes are in memory.
func (b *validateBody) Close() error { return nil }

// Reset makes b read body from its start again, without the reading.
func (b *validateBody) Reset(body []byte) {
	b.Reader.Reset(body)
	b.reading = nil
}
