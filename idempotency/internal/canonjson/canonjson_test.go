package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// canonicalJSON returns body in canonical form; ok is false if body is not
// exactly one JSON value.
func canonicalJSON(body []byte, maxDepth int) (out []byte, ok bool, err error) {
	c, err := Parse(body, maxDepth)
	if c == nil || err != nil {
		return nil, false, err
	}
	defer c.Release()
	var buf bytesWriter
	c.WriteCanonical(&buf)
	return buf, true, nil
}

type bytesWriter []byte

func (b *bytesWriter) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }

// jsonNode is a JSON value as a test oracle sees it: decoded by
// encoding/json's own tokenizer, members in document order.
type jsonNode struct {
	kind    byte // '{', '[' or 0 for a scalar
	names   []string
	members []*jsonNode // object members, parallel to names
	elems   []*jsonNode
	scalar  json.Token
}

// parseNode decodes one JSON value; ok is false unless data is exactly one.
func parseNode(data []byte) (n *jsonNode, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	n, err := readNode(dec)
	if err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return n, true
}

func readNode(dec *json.Decoder) (*jsonNode, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		n := &jsonNode{kind: '{'}
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := readNode(dec)
			if err != nil {
				return nil, err
			}
			n.names = append(n.names, name.(string))
			n.members = append(n.members, v)
		}
		_, err := dec.Token()
		return n, err
	case json.Delim('['):
		n := &jsonNode{kind: '['}
		for dec.More() {
			v, err := readNode(dec)
			if err != nil {
				return nil, err
			}
			n.elems = append(n.elems, v)
		}
		_, err := dec.Token()
		return n, err
	}
	return &jsonNode{scalar: tok}, nil
}

// depth is the nesting of objects and arrays: 0 for a scalar.
func (n *jsonNode) depth() int {
	d := 0
	for _, c := range append(n.members, n.elems...) {
		d = max(d, c.depth())
	}
	if n.kind != 0 {
		d++
	}
	return d
}

// collides reports whether some object has two names that bytes.EqualFold
// (encoding/json's documented rule for matching a name to a field) finds
// equal.
func (n *jsonNode) collides() bool {
	for i := range n.names {
		for j := i + 1; j < len(n.names); j++ {
			if bytes.EqualFold([]byte(n.names[i]), []byte(n.names[j])) {
				return true
			}
		}
	}
	for _, c := range append(n.members, n.elems...) {
		if c.collides() {
			return true
		}
	}
	return false
}

// reserialise writes n another way that encoding/json reads the same:
// members in reverse order, whitespace added, strings escaped as
// json.Marshal escapes them.
func (n *jsonNode) reserialise(b *strings.Builder) {
	switch n.kind {
	case '{':
		b.WriteString("{ ")
		for i := len(n.names) - 1; i >= 0; i-- {
			name, _ := json.Marshal(n.names[i])
			b.Write(name)
			b.WriteString(" :\t")
			n.members[i].reserialise(b)
			if i > 0 {
				b.WriteString(" ,\n")
			}
		}
		b.WriteString(" }")
	case '[':
		b.WriteString("[ ")
		for i, e := range n.elems {
			if i > 0 {
				b.WriteString(" , ")
			}
			e.reserialise(b)
		}
		b.WriteString(" ]")
	default:
		switch v := n.scalar.(type) {
		case json.Number:
			b.WriteString(v.String())
		default:
			out, _ := json.Marshal(v)
			b.Write(out)
		}
	}
}

// reading is a struct whose fields encoding/json matches to member names
// case-insensitively, as a handler's request type does.
type reading struct {
	A, B, K, S, Amount, Customer any
	N                            *reading
	L                            []reading
}

// readings decodes body as handlers do: into a struct (names matched
// case-insensitively, the last one winning) and into any (names as sent).
func readings(body []byte) (st reading, stErr bool, generic any) {
	stErr = json.Unmarshal(body, &st) != nil
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	_ = dec.Decode(&generic)
	return st, stErr, generic
}

// FuzzCanonicalFormHasOneReading checks the promise the fingerprint
// builds on: two bodies that a handler reads differently never share a
// canonical form, and two that it reads the same do. Two JSON bodies
// share a fingerprint exactly when they share a canonical form. It
// checks, for one body:
//   - a body is refused exactly when it nests deeper than the limit or an
//     object has two names that bytes.EqualFold finds equal;
//   - the canonical form of an accepted body is read exactly as the body is,
//     into a struct and into any (so no two bodies read differently share a
//     canonical form), and is canonical itself;
//   - the body written another way (members reversed, other whitespace and
//     escapes) has the same canonical form, or is refused the same way.
func FuzzCanonicalFormHasOneReading(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,null,"x\u0041"]}`, ` [ 1 , 2.50 , -0 ] `, `"\n\"\\"`, `{"a":1,"a":2}`, `{}`, `[]`, `nope`,
		`{"<":"&"}`, `{"amount":1500,"AMOUNT":2000}`, `{"AMOUNT":2000,"amount":1500}`, `{"customer":"a","cuſtomer":"b"}`,
		`{"k":1,"K":2}`, `{"s":1,"ſ":2}`, `{"n":{"a":1,"\u0041":2}}`, `{"l":[{"b":1,"B":2}]}`, "{\"\xff\":1,\"\xfe\":2}",
		`{"a":"\ud800","b":"\udc00"}`, "[\"\xff\",\"\xfe\"]", `[[[[[[1]]]]]]`, `{"n":{"n":{"n":{}}}}`,
		`["\ud800"]`, `["\udbff"]`, `["\ufffd"]`, `["\ud83d\ude00"]`, `["\ud83d\u0041"]`, `["\udc00\ud800"]`, `["\ud800\\u"]`,
		"[\"\xed\xa0\x80\"]", "{\"a\":1,\"b\":\"\xf4\x90\x80\x80\"}", `{"\ud800":1,"\udbff":2}`, `"\\ud800"`,
	} {
		f.Add([]byte(s))
	}
	const maxDepth = 5
	f.Fuzz(func(t *testing.T, body []byte) {
		form, _, err := canonicalJSON(body, maxDepth)
		node, isJSON := parseNode(body)
		if isJSON != json.Valid(body) {
			t.Skip("oracle disagrees with json.Valid") // cannot happen: one tokenizer
		}
		deep, dup := isJSON && node.depth() > maxDepth, isJSON && node.collides()
		notUTF8 := isJSON && (!utf8.Valid(body) || loneSurrogate(body))
		switch {
		case !isJSON:
			if err != nil {
				t.Fatalf("%q: not JSON, yet refused: %v", body, err)
			}
			return
		case deep || dup || notUTF8:
			// A body refused for more than one reason may be refused for
			// any of them.
			if !(deep && errors.Is(err, ErrTooDeep) || dup && errors.Is(err, ErrDuplicateName) || notUTF8 && errors.Is(err, ErrNotUTF8)) {
				t.Fatalf("%q: too deep %v, names colliding after case folding %v, not UTF-8 %v; got %v", body, deep, dup, notUTF8, err)
			}
			return
		case err != nil:
			t.Fatalf("%q: refused: %v", body, err)
		}

		canon, ok, err := canonicalJSON(body, maxDepth)
		if !ok || err != nil || !json.Valid(canon) {
			t.Fatalf("%q: canonical form %q (%v, %v) is not JSON", body, canon, ok, err)
		}
		// An accepted body is UTF-8 without a lone surrogate, which
		// encoding/json reads without loss: the readings compared below
		// then tell every two different texts apart.
		if !utf8.Valid(canon) || loneSurrogate(canon) {
			t.Fatalf("%q: canonical form %q is not UTF-8", body, canon)
		}
		bodySt, bodyErr, bodyAny := readings(body)
		canonSt, canonErr, canonAny := readings(canon)
		if bodyErr != canonErr || !reflect.DeepEqual(bodySt, canonSt) {
			t.Fatalf("%q: as a struct %+v (error %v), canonical form %q reads %+v (error %v)", body, bodySt, bodyErr, canon, canonSt, canonErr)
		}
		if !reflect.DeepEqual(bodyAny, canonAny) {
			t.Fatalf("%q: reads %v, canonical form %q reads %v", body, bodyAny, canon, canonAny)
		}
		if again, _, _ := canonicalJSON(canon, maxDepth); !bytes.Equal(canon, again) {
			t.Fatalf("%q: %q is not canonical: %q", body, canon, again)
		}

		var b strings.Builder
		node.reserialise(&b)
		other, _, err := canonicalJSON([]byte(b.String()), maxDepth)
		if err != nil || !bytes.Equal(other, form) {
			t.Fatalf("%q: written as %q, another canonical form %q (%v)", body, b.String(), other, err)
		}
	})
}

// loneSurrogate reports whether a string of body, valid JSON, escapes
// half of a UTF-16 surrogate pair without the other half right after
// it. It is the fuzz oracle of that rule, written apart from the parse.
func loneSurrogate(body []byte) bool {
	inString, high := false, false // high: an escaped high half was just read
	for i := 0; i < len(body); i++ {
		if !inString {
			inString = body[i] == '"'
			continue
		}
		if body[i] == '\\' && body[i+1] == 'u' {
			v, _ := strconv.ParseUint(string(body[i+2:i+6]), 16, 16)
			i += 5
			switch {
			case high && 0xdc00 <= v && v <= 0xdfff:
				high = false
			case high || 0xdc00 <= v && v <= 0xdfff:
				return true
			default:
				high = 0xd800 <= v && v <= 0xdbff
			}
			continue
		}
		if high {
			return true
		}
		switch body[i] {
		case '\\':
			i++
		case '"':
			inString = false
		}
	}
	return false
}

// FuzzParseReadsJSONAsJSONValidDoes: the fingerprint's parse, which
// checks the grammar as it goes, takes a body for JSON exactly when
// json.Valid does (JSON refused for its names or depth counts as JSON), so
// that no body moves between the canonical and the raw hash.
func FuzzParseReadsJSONAsJSONValidDoes(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `1`, `-0`, `-01`, `01`, `1.`, `.5`, `1e`, `1e+`, `1E-7`, `-`, `tru`, `true`, `truex`, `nul`, `null `,
		`"`, `"a`, `"\u00e9"`, `"\u00g9"`, `"\x"`, "\"\x01\"", "\"\xff\"", `"\/"`, `[1,]`, `[,1]`, `{"a":1,}`, `{"a" 1}`,
		`{a:1}`, `{"a":1}}`, `[1] [2]`, ` `, "\t[\n1\r]", `{"a":[1,{"b":null}]}`, `{"a":1,"A":2}`, `{"a":1,"A":2`,
		`{"a":1,"A":2}x`, `[[[[[[1]]]]]]`, `[[[[[[1]]]]]`, `"\ud800"`, `"\ud800\udc00"`, `"\ud800\u00"`, `"\ud800\"`, `{"":0}`, `[1 2]`, `{"a":1 "b":2}`, `+1`, `1.5e3.2`,
	} {
		f.Add([]byte(s), 5)
	}
	f.Add([]byte(strings.Repeat("[", 10001)+strings.Repeat("]", 10001)), 20000)
	f.Add([]byte(strings.Repeat("[", 10000)+strings.Repeat("]", 10000)), 20000)
	f.Fuzz(func(t *testing.T, body []byte, maxDepth int) {
		if len(body) == 0 {
			return
		}
		c, err := Parse(body, maxDepth)
		if c != nil {
			c.Release()
		}
		if got, want := c != nil || err != nil, json.Valid(body); got != want {
			t.Fatalf("%q (max depth %d): taken for JSON %v (error %v), json.Valid %v", body, maxDepth, got, err, want)
		}
	})
}
