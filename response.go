package idem

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/idemkit/idem/persist"
)

// Response is the final answer to an intent.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	// Replayed is true when the server answered from its idempotency record.
	// (The answer says Idempotent-Replayed: true.) An earlier attempt did
	// the work, and its answer was lost.
	Replayed bool
	// Attempts is how many attempts this call put on the wire. It is 0 when
	// the answer came from the device's store.
	Attempts int
	// FromStore is true when the intent was already resolved and nothing was
	// sent.
	FromStore bool
	// NotRecorded is true when this answer arrived but the device could not
	// save it. (Do returns it with a *SaveError.) The answer is the
	// server's, and final all the same. But the intent stays unresolved on
	// the device. The next Do gets the server's replay of it.
	NotRecorded bool
	// Oversized is true when the answer was larger than
	// Server.MaxResponseBytes. The limit counts header fields and body
	// together. The answer's status is known, and the intent is resolved
	// from it. But its body was not kept, and Body is nil. Its header fields
	// are only those stored, as far as they fit the limit.
	Oversized bool
}

func responseFromStored(r *persist.Response, sent int, fromStore bool) *Response {
	return &Response{
		StatusCode: r.StatusCode,
		Header:     r.Header.Clone(),
		Body:       bytes.Clone(r.Body),
		Replayed:   r.Replayed,
		Oversized:  r.Oversized,
		Attempts:   sent,
		FromStore:  fromStore,
	}
}

func (r *Response) clone() *Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = bytes.Clone(r.Body)
	return &c
}

// storedHeaders are the header fields of a final answer kept on the device
// by default. They are what an app shows: the media type, and where the new
// resource is. They are also the replay marker, and the server's
// Retry-After.
var storedHeaders = []string{"Content-Type", "Location", "Idempotent-Replayed", "Retry-After"}

// headerBytes is the size of h as header fields on the wire. That size
// counts against the limit on an answer.
func headerBytes(h http.Header) int64 {
	var n int64
	for name, vs := range h {
		n += fieldBytes(name, vs)
	}
	return n
}

func fieldBytes(name string, vs []string) int64 {
	var n int64
	for _, v := range vs {
		n += int64(len(name) + len(v) + 4) // ": " and CRLF
	}
	return n
}

// readBody reads a whole body, at most limit bytes, and closes it.
func readBody(body io.ReadCloser, limit int64) ([]byte, error) {
	defer body.Close()
	// One byte past the limit tells a body over it. That fails when the
	// limit is the largest there is. limit+1 would wrap around to a bound of
	// nothing, and every body would read empty.
	bound := limit
	if bound < math.MaxInt64 {
		bound++
	}
	// io.ReadAll of an io.LimitReader, without the LimitReader.
	b := make([]byte, 0, 512)
	for int64(len(b)) < bound {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // let append grow it
		}
		n, err := body.Read(b[len(b):min(int64(cap(b)), bound)])
		b = b[:len(b)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", errBodyTooLarge, limit)
	}
	return b, nil
}

var (
	errBodyTooLarge = errors.New("idem: response body too large")
)
