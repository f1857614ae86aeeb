package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/idemkit/idem/idempotency/internal/canonjson"
)

// A fingerprint identifies a request's content. It is SHA-256 over the
// method, the path, the query and the body (see newFingerprint). Two
// attempts of one intent have the same fingerprint. A key reused for
// other content does not. It is the type of [Record.Fingerprint].
type fingerprint = [sha256.Size]byte

// fingerprintVersion numbers the algorithm of newFingerprint
// ([Record.FingerprintVersion]). It is the only one this code makes or
// reads. A record of another version never matches a request. A release
// that changes the algorithm gives it the next number.
const fingerprintVersion = 1

// defaultMaxDepth is the deepest a JSON body's objects and arrays may
// nest when [Config.MaxDepth] is zero. {} is one level, {"a":[]} two.
const defaultMaxDepth = 100

// The errors of the fingerprint for a JSON body without a single reading
// (see package canonjson). A 400 answer shows them.
var (
	errJSONTooDeep       = canonjson.ErrTooDeep
	errJSONDuplicateName = canonjson.ErrDuplicateName
	errJSONNotUTF8       = canonjson.ErrNotUTF8
)

// newFingerprint fingerprints a request with the algorithm of
// [fingerprintVersion]. It is SHA-256 over the method, the path, the
// query string and the body. The query string is rawQuery, without the
// '?'.
//
// The query is taken canonically, as a handler reads it through
// url.Values. Parameters are split on '&', and empty ones are dropped.
// Each name and value is decoded as url.QueryUnescape decodes it. So
// '+' and %20 are both a space, and %7E is '~'. "a" and "a=" are both a
// with the empty value. A parameter that does not decode is taken as
// written. Examples are a bad %-escape, or a ';', which url.ParseQuery
// refuses.
//
// The parameters are then ordered by name. The values of a repeated
// name keep their order. So ?a=1&b=2 and ?b=2&a=1 are one fingerprint.
// But ?a=1&a=2 and ?a=2&a=1 are two, since url.Values.Get reads the
// first value.
//
// A body that is one JSON value is hashed in canonical form (see package
// canonjson). So a client that re-serialises the same object gets the
// same fingerprint. Any other body, or one over 2 GiB, is hashed raw.
//
// A JSON body must have one reading for the fingerprint to mean
// anything. So newFingerprint refuses three kinds of body, with an
// error wrapping one of these:
//
//   - errJSONDuplicateName: two names of an object are equal folded.
//   - errJSONNotUTF8: it is not UTF-8, or has a lone surrogate escape.
//   - errJSONTooDeep: its objects and arrays nest deeper than maxDepth.
//
// Names are folded as encoding/json folds them, and checked at any
// depth. A maxDepth of zero or less means defaultMaxDepth. A body nested
// deeper than 10000 levels is not JSON to encoding/json. It is hashed
// raw.
//
// The work and memory are linear in the size of the body. They are n
// log n in the number of query parameters.
func newFingerprint(method, path, rawQuery string, body []byte, maxDepth int) (fingerprint, error) {
	c, err := parseJSON(body, maxDepth)
	if c != nil {
		defer c.Release()
	}
	if err != nil {
		return fingerprint{}, err
	}
	return fingerprintParsed(method, path, rawQuery, body, c), nil
}

// parseJSON reads body for the fingerprint (see package canonjson). It
// returns nil when body is not JSON. A maxDepth of zero or less means
// defaultMaxDepth.
func parseJSON(body []byte, maxDepth int) (*canonjson.Value, error) {
	if maxDepth <= 0 {
		maxDepth = defaultMaxDepth
	}
	return canonjson.Parse(body, maxDepth)
}

// fingerprintParsed is newFingerprint for a body already parsed. c is
// parseJSON's reading of body, nil when body is not JSON.
func fingerprintParsed(method, path, rawQuery string, body []byte, c *canonjson.Value) fingerprint {
	var f fingerprint
	h := newHasher()
	defer h.release()
	h.stringField(method)
	h.stringField(path)
	writeQuery(h, rawQuery)
	if c != nil {
		// The body is the last field, so its end needs no length.
		h.byte('j')
		c.WriteCanonical(h)
	} else {
		h.byte('r')
		h.field(body)
	}
	h.sum(&f)
	return f
}

// flushAt is the most input a hasher gathers before it streams.
const flushAt = 32 << 10

// hasher is SHA-256 over what is written to it. Input up to flushAt
// bytes is gathered and hashed in one call at the end. That avoids the
// allocations of a streaming hash. Longer input streams through one.
// The digest is the same either way: SHA-256 of everything written, in
// order.
type hasher struct {
	buf []byte
	h   hash.Hash // nil until the input outgrows buf
}

var hashers = sync.Pool{New: func() any { return &hasher{buf: make([]byte, 0, 512)} }}

func newHasher() *hasher { return hashers.Get().(*hasher) }

func (s *hasher) release() {
	if cap(s.buf) > flushAt {
		return // a large body's buffer is left to the collector
	}
	s.buf, s.h = s.buf[:0], nil
	hashers.Put(s)
}

// Write implements io.Writer for the canonical form's writer.
func (s *hasher) Write(p []byte) (int, error) {
	if len(s.buf)+len(p) > flushAt {
		if s.h == nil {
			s.h = sha256.New()
		}
		s.h.Write(s.buf)
		s.buf = s.buf[:0]
		if len(p) > flushAt {
			s.h.Write(p)
			return len(p), nil
		}
	}
	s.buf = append(s.buf, p...)
	return len(p), nil
}

func (s *hasher) byte(b byte) { s.buf = append(s.buf, b) }

// field writes b length-prefixed. So no two different (method, path,
// body) triples hash the same input.
func (s *hasher) field(b []byte) {
	s.buf = binary.BigEndian.AppendUint64(s.buf, uint64(len(b)))
	_, _ = s.Write(b)
}

// stringField is field for a string, without copying it when it is short.
func (s *hasher) stringField(v string) {
	s.buf = binary.BigEndian.AppendUint64(s.buf, uint64(len(v)))
	if len(s.buf)+len(v) > flushAt {
		_, _ = s.Write([]byte(v))
		return
	}
	s.buf = append(s.buf, v...)
}

func (s *hasher) sum(f *fingerprint) {
	if s.h == nil {
		*f = sha256.Sum256(s.buf)
		return
	}
	s.h.Write(s.buf)
	s.h.Sum(f[:0])
}

// queryParam is one parameter of a query string. It is decoded, or raw
// when it does not decode.
type queryParam struct {
	name, value string
	raw         bool
}

// writeQuery writes the canonical form of rawQuery (see newFingerprint).
// That is a count, then each parameter, ordered by name. The values of
// one name keep their order.
func writeQuery(h *hasher, rawQuery string) {
	var params []queryParam
	for rawQuery != "" {
		var piece string
		piece, rawQuery, _ = strings.Cut(rawQuery, "&")
		if piece == "" {
			continue
		}
		p := queryParam{name: piece, raw: true}
		if !strings.Contains(piece, ";") {
			rawName, rawValue, _ := strings.Cut(piece, "=")
			name, err1 := url.QueryUnescape(rawName)
			value, err2 := url.QueryUnescape(rawValue)
			if err1 == nil && err2 == nil {
				p = queryParam{name: name, value: value}
			}
		}
		params = append(params, p)
	}
	slices.SortStableFunc(params, func(a, b queryParam) int { return strings.Compare(a.name, b.name) })
	h.byte('q')
	h.buf = binary.BigEndian.AppendUint64(h.buf, uint64(len(params)))
	for _, p := range params {
		if p.raw {
			h.byte('r')
			h.stringField(p.name)
			continue
		}
		h.byte('d')
		h.stringField(p.name)
		h.stringField(p.value)
	}
}
