package contractcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
)

// member is one member of a JSON object, its value kept as sent.
type member struct {
	name  string
	value json.RawMessage
}

// jsonObject parses body as one JSON object and returns its members in
// order, or an error when body is not a JSON object.
func jsonObject(body []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, errors.New("the body is not a JSON object")
	}
	var ms []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errors.New("the body is not valid JSON")
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errors.New("the body is not valid JSON")
		}
		ms = append(ms, member{name: name, value: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, errors.New("the body is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("the body has data after its JSON object")
	}
	return ms, nil
}

// encodeObject writes the members as a JSON object; spaced puts each member
// on its own indented line with a space around the colon.
func encodeObject(ms []member, spaced bool) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		if spaced {
			b.WriteString("\n  ")
		}
		name, _ := json.Marshal(m.name)
		b.Write(name)
		if spaced {
			b.WriteString(" : ")
		} else {
			b.WriteByte(':')
		}
		b.Write(m.value)
	}
	if spaced {
		b.WriteString("\n")
	}
	b.WriteByte('}')
	return b.Bytes()
}

// reserialise returns the same JSON object as body with its members in
// reverse order and other whitespace: the same request to a server that
// fingerprints JSON in canonical form.
func reserialise(body []byte) ([]byte, error) {
	ms, err := jsonObject(body)
	if err != nil {
		return nil, err
	}
	rev := make([]member, len(ms))
	for i, m := range ms {
		rev[len(ms)-1-i] = m
	}
	return encodeObject(rev, true), nil
}

// changeBody returns a JSON body that differs from body in content and is
// likely still valid: its first integer member plus one, or else its first
// string member with " (changed)" appended.
func changeBody(body []byte) ([]byte, error) {
	ms, err := jsonObject(body)
	if err != nil {
		return nil, err
	}
	for i, m := range ms {
		if n, err := strconv.ParseInt(string(m.value), 10, 64); err == nil && n < 1<<62 {
			ms[i].value = json.RawMessage(strconv.FormatInt(n+1, 10))
			return encodeObject(ms, false), nil
		}
	}
	for i, m := range ms {
		var s string
		if json.Unmarshal(m.value, &s) == nil {
			v, _ := json.Marshal(s + " (changed)")
			ms[i].value = v
			return encodeObject(ms, false), nil
		}
	}
	return nil, errors.New("the body has no integer or string member to change")
}

// invalidBody returns body cut short: malformed JSON, which a server refuses
// before doing any work.
func invalidBody(body []byte) ([]byte, error) {
	if _, err := jsonObject(body); err != nil {
		return nil, err
	}
	b := bytes.TrimRight(body, " \t\r\n")
	return append([]byte(nil), b[:len(b)-1]...), nil
}
