package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
	"slices"
	"strings"
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
// exactly one JSON value. It is a single pass over the bytes rather than a
// decode into maps and a re-encode, which cost five times more.
func canonicalJSON(body []byte) ([]byte, bool) {
	if len(body) == 0 || !json.Valid(body) {
		return nil, false
	}
	c := canon{in: body}
	return c.value(make([]byte, 0, len(body))), true
}

// canon writes the canonical form of valid JSON: no insignificant
// whitespace, object members sorted by key (stable for duplicate keys),
// strings with only '"', '\\' and control characters escaped, numbers and
// literals as written.
type canon struct {
	in  []byte
	pos int
}

func (c *canon) ws() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canon) value(out []byte) []byte {
	c.ws()
	switch c.in[c.pos] {
	case '{':
		return c.object(out)
	case '[':
		return c.array(out)
	case '"':
		return appendString(out, c.str())
	}
	start := c.pos
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return append(out, c.in[start:c.pos]...)
		}
		c.pos++
	}
	return append(out, c.in[start:c.pos]...)
}

func (c *canon) array(out []byte) []byte {
	c.pos++ // [
	out = append(out, '[')
	c.ws()
	if c.in[c.pos] == ']' {
		c.pos++
		return append(out, ']')
	}
	for {
		out = c.value(out)
		c.ws()
		if c.in[c.pos] == ']' {
			c.pos++
			return append(out, ']')
		}
		c.pos++ // ,
		out = append(out, ',')
	}
}

func (c *canon) object(out []byte) []byte {
	c.pos++ // {
	c.ws()
	if c.in[c.pos] == '}' {
		c.pos++
		return append(out, '{', '}')
	}
	type member struct {
		key        string
		start, end int
	}
	var members []member
	var scratch []byte
	for {
		c.ws()
		key := c.str()
		c.ws()
		c.pos++ // :
		start := len(scratch)
		scratch = appendString(scratch, key)
		scratch = append(scratch, ':')
		scratch = c.value(scratch)
		members = append(members, member{key, start, len(scratch)})
		c.ws()
		if c.in[c.pos] == '}' {
			c.pos++
			break
		}
		c.pos++ // ,
	}
	slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out = append(out, '{')
	for i, m := range members {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, scratch[m.start:m.end]...)
	}
	return append(out, '}')
}

// str reads a string token and returns its value.
func (c *canon) str() string {
	start := c.pos
	c.pos++ // opening quote
	escaped := false
	for c.in[c.pos] != '"' {
		if c.in[c.pos] == '\\' {
			escaped = true
			c.pos++
		}
		c.pos++
	}
	c.pos++ // closing quote
	if !escaped {
		return string(c.in[start+1 : c.pos-1])
	}
	var s string
	_ = json.Unmarshal(c.in[start:c.pos], &s) // valid: checked by json.Valid
	return s
}

// appendString appends s quoted, escaping only what JSON requires, so that a
// string written without escapes is kept as it is.
func appendString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case b == '"' || b == '\\':
			out = append(out, '\\', b)
		case b < 0x20:
			out = append(out, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
		default:
			out = append(out, b)
		}
	}
	return append(out, '"')
}
