// Package canonjson reads a JSON body once and writes its canonical form.
// The idempotency middleware fingerprints a JSON body by this form. So a
// client that serialises the same object again gets the same fingerprint.
// In the form:
//
//   - Object members are sorted by their case-folded names.
//   - Insignificant whitespace is dropped.
//   - Strings are taken as encoding/json decodes them, and re-escaped.
//   - Numbers are kept as written.
//
// The form is frozen with the fingerprint's version. A change to it is a
// new version of the fingerprint (idempotency's fingerprintVersion). The
// package is internal, so the form has one user and one promise.
//
// A body has one reading, or Parse refuses it. It is UTF-8, and no deeper
// than a limit. No two names of an object are equal after encoding/json's
// case folding. The work and memory are linear in the size of the body.
package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The errors of Parse for JSON that has no single reading. A 400 answer
// shows their texts.
var (
	// ErrTooDeep is wrapped by the error for a JSON body nested deeper
	// than the limit.
	ErrTooDeep = errors.New("idempotency: JSON body nested too deep")
	// ErrDuplicateName is wrapped by the error for a JSON body with
	// colliding member names. Two names of one of its objects are equal
	// after encoding/json's case folding. Examples are "amount" and
	// "AMOUNT", or "customer" and "cuſtomer" with a long s. A decoder that
	// matches names case-insensitively keeps the last of them. One that
	// does not keeps both. So such a body has no single reading.
	ErrDuplicateName = errors.New("idempotency: JSON object has member names that are equal after case folding")
	// ErrNotUTF8 is wrapped by the error for a JSON body that is not
	// UTF-8 (RFC 8259, section 8.1). It has bytes that are not UTF-8, or
	// an escaped surrogate (\ud800) without its other half. encoding/json
	// reads each as U+FFFD. So "\ud800" and "\udbff" would be one body to
	// the fingerprint, and two to the client. Such a body is refused,
	// never read lossily.
	ErrNotUTF8 = errors.New("idempotency: JSON body is not UTF-8")
)

// Value is a JSON body read by Parse, ready to write in canonical form.
//
// It canonicalises valid JSON in two linear passes. Each pass reads
// every byte of the body once, whatever the nesting. Building each
// object's form from its members' forms would instead copy a subtree
// once per level above it.
//
// The first pass (Parse) checks the depth and the member names. It
// records the order of each object's members. The second pass
// (WriteCanonical) writes the canonical form, visiting each object's
// members in that order.
//
// Members are ordered by their folded names (see appendFoldedName).
// These are unique in an accepted object. So one sort both orders the
// members and finds colliding names, which end up side by side.
//
// Offsets are 32 bits, to keep the records small. So Parse takes a
// longer body for one that is not JSON.
type Value struct {
	in       []byte
	pos      int
	maxDepth int

	// objects are the body's objects in document order, by start offset.
	objects []object
	// members holds each closed object's members in canonical order, one
	// object after another. Open objects' members wait in pending.
	members, pending []member
	// names holds member names that had to be decoded, being escaped or
	// not valid UTF-8. A member refers to its name here or in the body.
	names []byte
	// fold and order are scratch space for ordering one object's members.
	fold  []byte
	order []foldedName

	out []byte // write buffer of the second pass
}

type object struct {
	start, end int32 // offsets of '{' and just past '}'
	lo, hi     int32 // members[lo:hi] are its members, in canonical order
}

type member struct {
	nameLo, nameHi int32 // the name's bytes, in names if decoded, else in the body
	keyOff         int32 // offset of the name's opening quote, for messages
	val            int32 // offset of the value
	decoded        bool  // the name is in names
}

type foldedName struct {
	lo, hi int32 // in fold
	m      int32 // index into the object's members
}

// grow returns s with room for one more element. It doubles a full
// capacity, so a large body leaves little garbage behind.
func grow[E any](s []E) []E {
	if len(s) < cap(s) {
		return s
	}
	return slices.Grow(s, max(cap(s), 16))
}

// Parse returns a Value ready to write body's canonical form. It returns
// nil if body is not one JSON value, or is over 2 GiB. A body nested
// deeper than 10000 levels is not JSON to encoding/json. Parse returns
// nil for it too. The caller gives the Value back with Release.
//
// Parse returns an error if body is JSON without a single reading. It
// also does if body nests deeper than maxDepth. maxDepth is at least 1,
// and {} is one level.
//
// The body is read once. The parse checks the JSON grammar as it goes,
// and accepts exactly what json.Valid accepts. A body refused for its
// names or its depth is refused only if it is JSON to the end. So
// json.Valid decides those few.
func Parse(body []byte, maxDepth int) (*Value, error) {
	if len(body) == 0 || len(body) > math.MaxInt32 {
		return nil, nil
	}
	c := canons.Get().(*Value)
	c.in, c.pos, c.maxDepth = body, 0, maxDepth
	err := c.value(0)
	if err == nil {
		if c.ws(); c.pos != len(c.in) {
			err = errNotJSON
		}
	}
	if err == nil && !utf8.Valid(body) {
		// Outside its strings JSON is ASCII. So the bytes that are not
		// UTF-8 are in a string, which encoding/json would read as U+FFFD.
		err = fmt.Errorf("%w: the bytes at offset %d are not UTF-8 (RFC 8259 asks for UTF-8); send the text as UTF-8", ErrNotUTF8, firstInvalidUTF8(body))
	}
	if err == nil {
		return c, nil
	}
	c.Release()
	if err == errNotJSON || !json.Valid(body) {
		return nil, nil
	}
	return nil, err
}

// errNotJSON ends the parse of a body that is not one JSON value.
var errNotJSON = errors.New("not JSON")

// maxNesting is the deepest nesting encoding/json takes for JSON.
const maxNesting = 10000

// canons keeps Values for reuse, with their scratch space. Parsing a
// small body then allocates nothing.
var canons = sync.Pool{New: func() any { return new(Value) }}

// Release returns c to the pool. If a large body grew its scratch
// space, c is left to the collector.
func (c *Value) Release() {
	if cap(c.objects) > 1024 || cap(c.members) > 1024 || cap(c.pending) > 1024 || cap(c.order) > 1024 ||
		cap(c.names) > flushAt || cap(c.fold) > flushAt || cap(c.out) > 2*flushAt {
		return
	}
	*c = Value{objects: c.objects[:0], members: c.members[:0], pending: c.pending[:0], names: c.names[:0],
		fold: c.fold[:0], order: c.order[:0], out: c.out[:0]}
	canons.Put(c)
}

func (c *Value) ws() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// value parses the value at c.pos, inside depth containers.
func (c *Value) value(depth int) error {
	c.ws()
	if c.pos >= len(c.in) {
		return errNotJSON
	}
	switch b := c.in[c.pos]; b {
	case '{', '[':
		if depth >= c.maxDepth {
			return fmt.Errorf("%w: objects and arrays nest more than %d levels (at byte %d)", ErrTooDeep, c.maxDepth, c.pos)
		}
		if depth >= maxNesting {
			return errNotJSON
		}
		if b == '{' {
			return c.object(depth + 1)
		}
		return c.array(depth + 1)
	case '"':
		return c.string()
	case 't':
		return c.literal("true")
	case 'f':
		return c.literal("false")
	case 'n':
		return c.literal("null")
	}
	return c.number()
}

// next skips whitespace and reports whether the byte there is b. If so,
// it takes it.
func (c *Value) next(b byte) bool {
	c.ws()
	if c.pos < len(c.in) && c.in[c.pos] == b {
		c.pos++
		return true
	}
	return false
}

func (c *Value) array(depth int) error {
	c.pos++ // [
	if c.next(']') {
		return nil
	}
	for {
		if err := c.value(depth); err != nil {
			return err
		}
		if c.next(']') {
			return nil
		}
		if !c.next(',') {
			return errNotJSON
		}
	}
}

func (c *Value) object(depth int) error {
	ord := len(c.objects)
	c.objects = append(grow(c.objects), object{start: int32(c.pos)})
	c.pos++ // {
	base := len(c.pending)
	if !c.next('}') {
		for {
			c.ws()
			m, err := c.name()
			if err != nil {
				return err
			}
			if !c.next(':') {
				return errNotJSON
			}
			c.ws()
			m.val = int32(c.pos)
			c.pending = append(grow(c.pending), m)
			if err := c.value(depth); err != nil {
				return err
			}
			if c.next('}') {
				break
			}
			if !c.next(',') {
				return errNotJSON
			}
		}
	}
	o := &c.objects[ord]
	o.end = int32(c.pos)
	o.lo = int32(len(c.members))
	if err := c.closeObject(c.pending[base:], o.start); err != nil {
		return err
	}
	o.hi = int32(len(c.members))
	c.pending = c.pending[:base]
	return nil
}

// string checks the string at c.pos as encoding/json's scanner does,
// and moves past it. It refuses raw control characters and escapes
// JSON lacks. Any other byte passes, valid UTF-8 or not; Parse checks
// the bytes. A surrogate escape without its other half is an error
// wrapping ErrNotUTF8.
func (c *Value) string() error {
	in := c.in
	i := c.pos + 1
	for i < len(in) {
		switch b := in[i]; {
		case b == '"':
			c.pos = i + 1
			return nil
		case b < 0x20:
			return errNotJSON
		case b == '\\':
			i++
			if i >= len(in) {
				return errNotJSON
			}
			switch in[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(in) {
					return errNotJSON
				}
				u, ok := hex4(in[i+1 : i+5])
				if !ok {
					return errNotJSON
				}
				i += 4
				if utf16.IsSurrogate(rune(u)) {
					// A high half must be followed at once by an escaped
					// low half. A low half must follow a high one.
					low, paired := uint16(0), false
					if u < 0xdc00 && i+6 < len(in) && in[i+1] == '\\' && in[i+2] == 'u' {
						low, paired = hex4(in[i+3 : i+7])
						paired = paired && 0xdc00 <= low && low <= 0xdfff
					}
					if !paired {
						return fmt.Errorf("%w: the escape \\u%04x at offset %d is half of a UTF-16 surrogate pair, without its other half; encode the character it is part of", ErrNotUTF8, u, i-5)
					}
					i += 6
				}
			default:
				return errNotJSON
			}
		}
		i++
	}
	return errNotJSON
}

// hex4 decodes four hex digits.
func hex4(h []byte) (uint16, bool) {
	var v uint16
	for _, b := range h {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b -= 'a' - 10
		case 'A' <= b && b <= 'F':
			b -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(b)
	}
	return v, true
}

// firstInvalidUTF8 returns the offset of the first byte of b that does
// not begin a UTF-8 sequence, or len(b).
func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// literal moves past word (true, false or null) at c.pos.
func (c *Value) literal(word string) error {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(word)) {
		return errNotJSON
	}
	c.pos += len(word)
	return nil
}

// number moves past the number at c.pos: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *Value) number() error {
	in, i := c.in, c.pos
	digits := func() bool {
		start := i
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(in) && in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case !digits():
		return errNotJSON
	}
	if i < len(in) && in[i] == '.' {
		i++
		if !digits() {
			return errNotJSON
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if !digits() {
			return errNotJSON
		}
	}
	c.pos = i
	return nil
}

// name reads a member name at c.pos as encoding/json decodes it.
func (c *Value) name() (member, error) {
	start := c.pos
	if start >= len(c.in) || c.in[start] != '"' {
		return member{}, errNotJSON
	}
	if err := c.string(); err != nil {
		return member{}, err
	}
	m := member{keyOff: int32(start), nameLo: int32(start + 1), nameHi: int32(c.pos - 1)}
	if raw := c.in[start+1 : c.pos-1]; !plainString(raw) {
		m.decoded, m.nameLo = true, int32(len(c.names))
		c.names = append(c.names, decodeString(c.in[start:c.pos])...)
		m.nameHi = int32(len(c.names))
	}
	return m, nil
}

func (c *Value) nameOf(m member) []byte {
	if m.decoded {
		return c.names[m.nameLo:m.nameHi]
	}
	return c.in[m.nameLo:m.nameHi]
}

// closeObject appends ms, the members of the object at start, to
// c.members. Their order is canonical, by folded name. It returns an
// error wrapping ErrDuplicateName if two names are equal after folding.
func (c *Value) closeObject(ms []member, start int32) error {
	if cap(c.members)-len(c.members) < len(ms) {
		c.members = slices.Grow(c.members, max(len(ms), cap(c.members)))
	}
	if len(ms) < 2 {
		c.members = append(c.members, ms...)
		return nil
	}
	c.fold, c.order = c.fold[:0], slices.Grow(c.order[:0], len(ms))
	for i, m := range ms {
		lo := int32(len(c.fold))
		c.fold = appendFoldedName(c.fold, c.nameOf(m))
		c.order = append(c.order, foldedName{lo: lo, hi: int32(len(c.fold)), m: int32(i)})
	}
	fold := c.fold
	slices.SortFunc(c.order, func(a, b foldedName) int { return bytes.Compare(fold[a.lo:a.hi], fold[b.lo:b.hi]) })
	for i := 1; i < len(c.order); i++ {
		a, b := c.order[i-1], c.order[i]
		if !bytes.Equal(fold[a.lo:a.hi], fold[b.lo:b.hi]) {
			continue
		}
		first, second := ms[a.m], ms[b.m]
		if first.keyOff > second.keyOff {
			first, second = second, first
		}
		return fmt.Errorf("%w: %q and %q in the object at byte %d; a decoder that matches names case-insensitively, as Go's encoding/json does, reads only the last; send each name once",
			ErrDuplicateName, c.nameOf(first), c.nameOf(second), start)
	}
	for _, f := range c.order {
		c.members = append(c.members, ms[f.m])
	}
	return nil
}

// WriteCanonical writes the canonical form to w, in pieces of up to
// flushAt bytes.
func (c *Value) WriteCanonical(w io.Writer) {
	c.out = c.out[:0]
	c.write(w, 0)
	_, _ = w.Write(c.out)
	c.out = c.out[:0]
}

// flushAt is the size of the pieces WriteCanonical writes. It also
// bounds the scratch space a Value keeps for reuse.
const flushAt = 32 << 10

// write writes the value at pos and returns the offset just past it.
func (c *Value) write(w io.Writer, pos int) int {
	for c.isSpace(pos) {
		pos++
	}
	if len(c.out) >= flushAt {
		_, _ = w.Write(c.out)
		c.out = c.out[:0]
	}
	switch c.in[pos] {
	case '{':
		o := c.objects[c.objectIndex(pos)]
		c.out = append(c.out, '{')
		for i, m := range c.members[o.lo:o.hi] {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.out = appendString(c.out, c.nameOf(m))
			c.out = append(c.out, ':')
			c.write(w, int(m.val))
		}
		c.out = append(c.out, '}')
		return int(o.end)
	case '[':
		c.out = append(c.out, '[')
		pos++
		for c.isSpace(pos) {
			pos++
		}
		if c.in[pos] == ']' {
			c.out = append(c.out, ']')
			return pos + 1
		}
		for {
			pos = c.write(w, pos)
			for c.isSpace(pos) {
				pos++
			}
			pos++
			if c.in[pos-1] == ']' {
				c.out = append(c.out, ']')
				return pos
			}
			c.out = append(c.out, ',')
		}
	case '"':
		end := stringEnd(c.in, pos)
		if raw := c.in[pos:end]; plainString(raw[1 : len(raw)-1]) {
			// Nothing escaped, valid UTF-8: already canonical.
			c.out = append(c.out, raw...)
		} else {
			c.out = appendString(c.out, decodeString(raw))
		}
		return end
	}
	end := literalEnd(c.in, pos)
	c.out = append(c.out, c.in[pos:end]...)
	return end
}

func (c *Value) isSpace(pos int) bool {
	if pos >= len(c.in) {
		return false
	}
	switch c.in[pos] {
	case ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// objectIndex returns the index in c.objects of the object that starts
// at pos. c.objects is in document order.
func (c *Value) objectIndex(pos int) int {
	lo, hi := 0, len(c.objects)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if int(c.objects[mid].start) < pos {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Len returns the number of members of the body's object, -1 if the body
// is not one.
func (c *Value) Len() int {
	pos := 0
	for c.isSpace(pos) {
		pos++
	}
	if len(c.objects) == 0 || int(c.objects[0].start) != pos {
		return -1
	}
	return int(c.objects[0].hi - c.objects[0].lo)
}

// Member returns the body's object's member i (0 <= i < Len()), in
// canonical order. The name is decoded. The value is its token as
// written. For an object or an array, that is its opening bracket.
func (c *Value) Member(i int) (name, value []byte) {
	m := c.members[int(c.objects[0].lo)+i]
	v := int(m.val)
	switch c.in[v] {
	case '"':
		return c.nameOf(m), c.in[v:stringEnd(c.in, v)]
	case '{', '[':
		return c.nameOf(m), c.in[v : v+1]
	}
	return c.nameOf(m), c.in[v:literalEnd(c.in, v)]
}

// stringEnd returns the offset just past the string token at start.
func stringEnd(in []byte, start int) int {
	i := start + 1
	for in[i] != '"' {
		if in[i] == '\\' {
			i++
		}
		i++
	}
	return i + 1
}

// literalEnd returns the offset just past the number, true, false or
// null at start.
func literalEnd(in []byte, start int) int {
	i := start
	for i < len(in) {
		switch in[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// plainString reports whether a string token's contents need no
// decoding. They need none when they have no escapes and are valid
// UTF-8. Valid JSON has no raw control characters or quotes in a
// string.
func plainString(raw []byte) bool {
	for _, b := range raw {
		if b == '\\' {
			return false
		}
	}
	return utf8.Valid(raw)
}

// decodeString decodes a string token as encoding/json does, resolving
// its escapes. It would replace invalid UTF-8 and lone surrogates by
// U+FFFD. But Parse refuses a body that has either.
func decodeString(token []byte) []byte {
	var s string
	_ = json.Unmarshal(token, &s) // valid: checked by json.Valid
	return []byte(s)
}

// appendString appends s quoted, escaping only what JSON requires. So a
// string written without escapes is kept as it is.
func appendString(out, s []byte) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for _, b := range s {
		switch {
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

// appendFoldedName appends name folded as encoding/json folds member
// names to match struct fields. ASCII letters go to upper case. Every
// other rune goes to the smallest rune of its Unicode fold set. So 'ſ'
// (long s) folds with 's', and 'K' (Kelvin sign) with 'k'. This is
// encoding/json/fold.go's folding. There foldName(x) == foldName(y)
// exactly when bytes.EqualFold(x, y).
func appendFoldedName(out, name []byte) []byte {
	for i := 0; i < len(name); {
		if c := name[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		out = utf8.AppendRune(out, foldRune(r))
		i += n
	}
	return out
}

// foldRune returns the smallest rune of r's fold set.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}
