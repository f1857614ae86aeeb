package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
)

// goldenPath holds the fingerprints of goldenCases as the algorithm gave
// them when they were written. Records already stored compare against
// these values, so a change to how the fingerprint is computed must leave
// every one of them as it is. IDEM_WRITE_GOLDEN=1 rewrites the file; do it
// only with a new version of the algorithm. JSON bodies that are not
// UTF-8 were read lossily (as U+FFFD) until JSON had to be UTF-8; they
// are refused since, as "error not-utf8", and no other line changed.
const goldenPath = "testdata/fingerprint_golden.txt"

type goldenCase struct {
	method, path, query string
	body                []byte
	maxDepth            int
}

func (c goldenCase) line() string {
	fp, err := newFingerprint(c.method, c.path, c.query, c.body, c.maxDepth)
	out := hex.EncodeToString(fp[:])
	if err != nil {
		// The error's kind, not its text, is what callers rely on.
		out = "error"
		switch {
		case strings.Contains(err.Error(), errJSONDuplicateName.Error()):
			out = "error duplicate-name"
		case strings.Contains(err.Error(), errJSONTooDeep.Error()):
			out = "error too-deep"
		case strings.Contains(err.Error(), errJSONNotUTF8.Error()):
			// Read lossily, as U+FFFD, before JSON had to be UTF-8.
			out = "error not-utf8"
		}
	}
	in := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%s\x00%d\x00%s", c.method, c.path, c.query, c.maxDepth, c.body))
	return hex.EncodeToString(in[:8]) + " " + out
}

// goldenCases are the bodies and queries of the fingerprint's tests and
// fuzz seeds, then bodies made at random from a
// fixed seed: objects, arrays, escapes, invalid UTF-8, every size from
// empty to past the hashing buffer, and bodies that are not JSON.
func goldenCases() []goldenCase {
	bodies := []string{
		"", "nope", "a=1&b=2", "b=2&a=1", `{}`, `[]`, `null`, `1`, `"x"`, ` {} `, `{} {}`, `{"a":1}x`,
		`{"a":1,"b":[1,2],"c":{"x":"y"}}`, `{"c":{"x":"y"},"b":[1,2],"a":1}`,
		" {\n\t\"a\" : 1 , \"b\" : [ 1 , 2 ] , \"c\" : { \"x\" : \"y\" } }\n",
		`{"a":1,"b":[1,2],"c":{"x":"\u0079"}}`, `{"\u0061":1,"b":[1,2],"c":{"x":"y"}}`,
		`{"a":2,"b":[1,2],"c":{"x":"y"}}`, `{"a":1.0,"b":[1,2],"c":{"x":"y"}}`, `{"A":1,"b":[1,2],"c":{"x":"y"}}`,
		`"{\"a\":1}"`, `{"amount":1500,"AMOUNT":2000}`, `{"AMOUNT":2000,"amount":1500}`, `{"amount":1500,"amount":2000}`,
		`{"amount":1500,"\u0061mount":2000}`, `{"customer":"cus_1","cuſtomer":"cus_2"}`, `{"customer":"cus_1","cu\u017ftomer":"cus_2"}`,
		"{\"kind\":\"a\",\"\u212aind\":\"b\"}", "{\"\xff\":1,\"\xfe\":2}", `{"meta":{"Note":"a","note":"b"}}`,
		`{"items":[{"sku":"a"},{"sku":"a","SKU":"b"}]}`, `{"a_b":1,"ab":2}`, `{"a-b":1,"ab":2}`, `{"s":1,"ß":2}`, `{"i":1,"ı":2}`,
		`{"amount":1500,"customer":"cus_1"}`, `{ "customer" : "cus_\u0031", "amount" : 1500 }`,
		"[\"\xff\"]", "[\"\xfe\"]", `["\ufffd"]`, `["\ud800"]`, `{"a":{"y":1,"x":[{"q":1,"p":2}]}}`,
		`{"b":1,"a":[true,null,"x\u0041"]}`, ` [ 1 , 2.50 , -0 ] `, `"\n\"\\"`, `{"a":1,"a":2}`,
		`{"<":"&"}`, `{"k":1,"K":2}`, `{"s":1,"ſ":2}`, `{"n":{"a":1,"\u0041":2}}`, `{"l":[{"b":1,"B":2}]}`,
		`{"a":"\ud800","b":"\udc00"}`, "[\"\xff\",\"\xfe\"]", `[[[[[[1]]]]]]`, `{"n":{"n":{"n":{}}}}`,
		`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"coffee"}`,
		`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"bench"}`,
		"{\"a\":\"\\u0000\\u001f\\\"\\\\\\/\\b\\f\\n\\r\\t\"}", "{\"\\u00e9\":\"\u00e9\",\"e\\u0301\":1}",
		string(nestedBody(101, 0)), string(nestedBody(100, 0)), string(nestedBody(10001, 0)), string(nestedBody(20, 70<<10)),
		strings.Repeat("x", 70<<10), `{"pad":"` + strings.Repeat("y", 40<<10) + `","a":[` + strings.Repeat(`"z",`, 9000) + `"z"]}`,
	}
	queries := []string{"", "a=1", "param1=a&param2=b", "b=2&a=1", "a=1&a=2", "a=2&a=1", "a=%zz;b", "x=a+b&name=%7E",
		"&&=&", "a", "a=", "%20=%2B", "a;b=1&c=2", "q=" + strings.Repeat("w", 40<<10)}
	var cs []goldenCase
	for _, b := range bodies {
		cs = append(cs, goldenCase{method: "POST", path: "/payments", body: []byte(b)})
	}
	for _, q := range queries {
		cs = append(cs, goldenCase{method: "GET", path: "/p", query: q, body: []byte(`{"b":1,"a":2}`)})
	}
	cs = append(cs,
		goldenCase{method: "POST", path: "/p", body: []byte(`[[[[[[1]]]]]]`), maxDepth: 5},
		goldenCase{method: "POST", path: "/p", body: []byte(`[[[[[1]]]]]`), maxDepth: 5},
		goldenCase{method: "POST/", path: "ab"},
		goldenCase{method: "POST", path: "/ab"},
		goldenCase{method: "PATCH", path: strings.Repeat("/p", 20<<10), body: []byte(`{"a":1}`)},
	)
	r := rand.New(rand.NewPCG(26, 1))
	for i := range 3000 {
		size := 1 + r.IntN(64)
		if i%100 == 0 {
			size = 2000 + r.IntN(4000) // past the hashing buffer
		}
		body := randomJSON(r, size, 0)
		switch r.IntN(10) {
		case 0: // cut short: not JSON
			body = body[:r.IntN(len(body)+1)]
		case 1:
			body = append([]byte(" \n"), append(body, '\t')...)
		}
		cs = append(cs, goldenCase{method: "POST", path: "/payments", body: body, maxDepth: []int{0, 3, 6}[r.IntN(3)]})
	}
	return cs
}

// randomJSON returns a JSON value of about budget members.
func randomJSON(r *rand.Rand, budget, depth int) []byte {
	names := []string{"a", "b", "A", "amount", "AMOUNT", "cuſtomer", "customer", "\\u0061", "\xff", "\xfe", "é", "e\\u0301", "K", "\u212a", "_", ""}
	if depth > 9 || budget <= 1 {
		switch r.IntN(8) {
		case 0:
			return []byte(strconv.Itoa(r.IntN(100000) - 50000))
		case 1:
			return []byte(strconv.FormatFloat(r.NormFloat64()*1e6, 'g', -1, 64))
		case 2:
			return []byte([]string{"true", "false", "null", "-0", "1e3", "1.50"}[r.IntN(6)])
		case 3:
			return []byte(`"\ud800x\u00e9\n\"\\"`)
		case 4:
			return []byte("\"\xc3\x28 \xf0\x9f\x98\x80\"")
		}
		s, _ := json.Marshal(names[r.IntN(len(names))] + strconv.Itoa(r.IntN(1000)))
		return s
	}
	var b bytes.Buffer
	n := 1 + r.IntN(min(budget, 12))
	if r.IntN(2) == 0 {
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteString([]string{",", " , ", ",\n"}[r.IntN(3)])
			}
			b.Write(randomJSON(r, budget/n, depth+1))
		}
		b.WriteByte(']')
		return b.Bytes()
	}
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteString([]string{",", " , ", ",\n"}[r.IntN(3)])
		}
		b.WriteString(`"` + names[r.IntN(len(names))] + strconv.Itoa(r.IntN(40)) + `":`)
		b.Write(randomJSON(r, budget/n, depth+1))
	}
	b.WriteByte('}')
	return b.Bytes()
}

// TestFingerprintGolden: every case fingerprints as it did when the file
// was written, whichever order the cases run in (the fingerprint reuses
// buffers from one call to the next).
func TestFingerprintGolden(t *testing.T) {
	cs := goldenCases()
	if os.Getenv("IDEM_WRITE_GOLDEN") == "1" {
		var b strings.Builder
		for _, c := range cs {
			b.WriteString(c.line() + "\n")
		}
		if err := os.WriteFile(goldenPath, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(want) != len(cs) {
		t.Fatalf("%s has %d lines for %d cases", goldenPath, len(want), len(cs))
	}
	check := func(order []int) {
		for _, i := range order {
			if got := cs[i].line(); got != want[i] {
				t.Fatalf("case %d (%s %s?%.40q, body %.80q): %s, was %s", i, cs[i].method, cs[i].path, cs[i].query, cs[i].body, got, want[i])
			}
		}
	}
	order := make([]int, len(cs))
	for i := range order {
		order[i] = i
	}
	check(order)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	check(order)
}

// nestedBody returns a JSON body of depth objects, each with a padding
// member, about size bytes in all.
func nestedBody(depth, size int) []byte {
	p := strings.Repeat("x", max(0, (size-depth*len(`{"p":"","n":}`))/depth))
	var b strings.Builder
	for range depth {
		b.WriteString(`{"p":"` + p + `","n":`)
	}
	b.WriteString("0" + strings.Repeat("}", depth))
	return []byte(b.String())
}
