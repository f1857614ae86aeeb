// Package jsonbody hands the idempotency middleware's reading of a JSON
// request body to a validation hook of this module (the fake server's), so
// that the fingerprint and the validation parse the body once between
// them.
//
// The middleware gives its Config.Validate a request whose Body is a
// [*Body] carrying the reading; [ReadingOf] finds it. Once the hook has
// returned, the reading is dropped and its memory reused: a hook must not
// keep it, or anything it returned.
package jsonbody

import (
	"bytes"
	"net/http"
)

// Reading is a JSON body as the fingerprint read it.
type Reading interface {
	// Len returns the number of members of the body's object, or -1 when
	// the body is not one JSON object.
	Len() int
	// Member returns the object's member i (0 <= i < Len()), in the
	// fingerprint's canonical order: its name, decoded as encoding/json
	// decodes it, and its value's token as written: a string with its
	// quotes and escapes, a number, true, false or null; for an object or
	// an array, its opening bracket only. The names of one object are
	// distinct even after encoding/json's case folding (the fingerprint
	// refuses other bodies).
	Member(i int) (name, value []byte)
}

// Body is the request body the middleware hands its validation hook: the
// body's bytes, and while the hook runs the middleware's reading of them.
type Body struct {
	bytes.Reader
	reading Reading
}

// NewBody returns a Body reading b, carrying reading (nil for a body that
// is not JSON).
func NewBody(b []byte, reading Reading) *Body {
	body := &Body{reading: reading}
	body.Reader.Reset(b)
	return body
}

// Close does nothing: the bytes are in memory.
func (b *Body) Close() error { return nil }

// Reset makes b read body from its start again, without the reading.
func (b *Body) Reset(body []byte) {
	b.Reader.Reset(body)
	b.reading = nil
}

// ReadingOf returns the middleware's reading of r's body while r is in
// the middleware's validation hook, and false otherwise or when the body
// is not JSON.
func ReadingOf(r *http.Request) (Reading, bool) {
	b, ok := r.Body.(*Body)
	if !ok || b.reading == nil {
		return nil, false
	}
	return b.reading, true
}
