package idempotency

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

func decodeAny(t *testing.T, b []byte) any {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return v
}

// FuzzCanonicalJSON checks that the canonical form is valid JSON with the
// same value, and canonical itself.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x\u0041"]}`, ` [ 1 , 2.50 , -0 ] `, `"\n\"\\"`, `{"a":1,"a":2}`, `{}`, `[]`, `nope`, `{"<":"&"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, ok := canonicalJSON(body)
		if ok != json.Valid(body) {
			t.Fatalf("%q: ok %v", body, ok)
		}
		if !ok {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("%q: canonical form %q is not JSON", body, out)
		}
		if !reflect.DeepEqual(decodeAny(t, body), decodeAny(t, out)) {
			t.Fatalf("%q: canonical form %q has another value", body, out)
		}
		again, _ := canonicalJSON(out)
		if !bytes.Equal(out, again) {
			t.Fatalf("%q: %q is not canonical: %q", body, out, again)
		}
	})
}
