package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
	"io"
)

// A Fingerprint identifies a request's content: SHA-256 over the method, the
// path and the body. Two attempts of one intent have the same fingerprint; a
// key reused for other content does not.
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// NewFingerprint fingerprints a request. A body that is one JSON value is
// hashed in canonical form (object keys sorted, insignificant whitespace
// dropped, strings re-escaped, numbers kept as written), so a client that
// re-serialises the same object gets the same fingerprint. Any other body is
// hashed as raw bytes. The query string is not part of the fingerprint: the
// contract fingerprints method, path and body.
func NewFingerprint(method, path string, body []byte) Fingerprint {
	h := sha256.New()
	writeField(h, []byte(method))
	writeField(h, []byte(path))
	if canon, ok := canonicalJSON(body); ok {
		h.Write([]byte{'j'})
		writeField(h, canon)
	} else {
		h.Write([]byte{'r'})
		writeField(h, body)
	}
	var f Fingerprint
	h.Sum(f[:0])
	return f
}

// writeField writes b length-prefixed, so that no two different
// (method, path, body) triples hash the same input.
func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// canonicalJSON returns body in canonical form, or false if body is not
// exactly one JSON value.
func canonicalJSON(body []byte) ([]byte, bool) {
	if len(body) == 0 {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return out, true
}
