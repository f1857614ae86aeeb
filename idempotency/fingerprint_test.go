package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
)

func fingerprint(t *testing.T, method, path, body string) idempotency.Fingerprint {
	t.Helper()
	f, err := idempotency.NewFingerprint(method, path, "", []byte(body), 0)
	require.NoError(t, err, "%s", body)
	return f
}

// TestFingerprint checks that a request's fingerprint is its content as
// its handler reads it: one fingerprint for one meaning, never two
// meanings under one.
func TestFingerprint(t *testing.T) {
	t.Run("bodies of one content share it and other contents change it", func(t *testing.T) {
		t.Parallel()
		base := fingerprint(t, "POST", "/payments", `{"a":1,"b":[1,2],"c":{"x":"y"}}`)
		same := []struct{ name, body string }{
			{"keys reordered", `{"c":{"x":"y"},"b":[1,2],"a":1}`},
			{"whitespace", " {\n\t\"a\" : 1 , \"b\" : [ 1 , 2 ] , \"c\" : { \"x\" : \"y\" } }\n"},
			{"escaped string", `{"a":1,"b":[1,2],"c":{"x":"\u0079"}}`},
			{"escaped name", `{"\u0061":1,"b":[1,2],"c":{"x":"y"}}`},
		}
		for _, tt := range same {
			t.Run(tt.name, func(t *testing.T) {
				assert.Equal(t, base, fingerprint(t, "POST", "/payments", tt.body))
			})
		}
		differ := []struct{ name, method, path, body string }{
			{"value", "POST", "/payments", `{"a":2,"b":[1,2],"c":{"x":"y"}}`},
			{"array order", "POST", "/payments", `{"a":1,"b":[2,1],"c":{"x":"y"}}`},
			{"number written differently", "POST", "/payments", `{"a":1.0,"b":[1,2],"c":{"x":"y"}}`},
			{"name in another case", "POST", "/payments", `{"A":1,"b":[1,2],"c":{"x":"y"}}`},
			{"method", "PATCH", "/payments", `{"a":1,"b":[1,2],"c":{"x":"y"}}`},
			{"path", "POST", "/payments/1", `{"a":1,"b":[1,2],"c":{"x":"y"}}`},
		}
		for _, tt := range differ {
			t.Run(tt.name, func(t *testing.T) {
				assert.NotEqual(t, base, fingerprint(t, tt.method, tt.path, tt.body))
			})
		}
		t.Run("raw bodies", func(t *testing.T) {
			a := fingerprint(t, "POST", "/x", "a=1&b=2")
			assert.Equal(t, a, fingerprint(t, "POST", "/x", "a=1&b=2"))
			assert.NotEqual(t, a, fingerprint(t, "POST", "/x", "b=2&a=1"))
		})
		t.Run("no ambiguity between fields", func(t *testing.T) {
			assert.NotEqual(t, fingerprint(t, "POST", "/ab", ""), fingerprint(t, "POST/", "ab", ""))
			assert.NotEqual(t, fingerprint(t, "POST", "/x", `{"a":1}`), fingerprint(t, "POST", "/x", `"{\"a\":1}"`))
		})
	})

	// A body whose member names collide after encoding/json's case folding
	// reads as its last colliding member to a struct decoder, so two orders
	// of it would be two payments under one fingerprint. Such bodies are
	// refused, at any depth.
	t.Run("bodies read differently never share it", func(t *testing.T) {
		t.Parallel()
		ambiguous := []string{
			`{"amount":1500,"AMOUNT":2000}`,
			`{"AMOUNT":2000,"amount":1500}`,
			`{"amount":1500,"amount":2000}`,
			`{"amount":1500,"\u0061mount":2000}`,
			`{"customer":"cus_1","cuſtomer":"cus_2"}`, // long s
			`{"customer":"cus_1","cu\u017ftomer":"cus_2"}`,
			"{\"kind\":\"a\",\"\u212aind\":\"b\"}",          // Kelvin sign
			"{\"\xff\":1,\"\xfe\":2}",                       // both decode to U+FFFD
			`{"meta":{"Note":"a","note":"b"}}`,              // nested
			`{"items":[{"sku":"a"},{"sku":"a","SKU":"b"}]}`, // in an array
		}
		for _, body := range ambiguous {
			t.Run(body, func(t *testing.T) {
				_, err := idempotency.NewFingerprint("POST", "/payments", "", []byte(body), 0)
				assert.ErrorIs(t, err, idempotency.ErrJSONDuplicateName)
			})
		}
		t.Run("names that differ after folding are kept apart", func(t *testing.T) {
			for _, body := range []string{`{"a_b":1,"ab":2}`, `{"a-b":1,"ab":2}`, `{"s":1,"ß":2}`, `{"i":1,"ı":2}`} {
				_, err := idempotency.NewFingerprint("POST", "/payments", "", []byte(body), 0)
				assert.NoError(t, err, body)
			}
		})
	})

	// Bodies that encoding/json reads the same share a fingerprint, however
	// they are written.
	t.Run("bodies read the same share it", func(t *testing.T) {
		t.Parallel()
		groups := [][]string{
			{`{"amount":1500,"customer":"cus_1"}`, `{"customer":"cus_1","amount":1500}`, `{ "customer" : "cus_\u0031", "amount" : 1500 }`},
			{`["\ud83d\ude00"]`, `["😀"]`, `["\uD83D\uDE00"]`},
			{`{"a":{"y":1,"x":[{"q":1,"p":2}]}}`, `{"a":{"x":[{"p":2,"q":1}],"y":1}}`},
		}
		for _, g := range groups {
			want := fingerprint(t, "POST", "/payments", g[0])
			for _, body := range g[1:] {
				assert.Equal(t, want, fingerprint(t, "POST", "/payments", body), "%s and %s", g[0], body)
			}
		}
	})

	// A JSON body is UTF-8 (RFC 8259). Bytes that are not UTF-8, or a
	// surrogate escape without its other half, would be read by
	// encoding/json as U+FFFD, so that bodies a client tells apart would
	// share a fingerprint: they are refused, never read lossily.
	t.Run("JSON is read as UTF-8 or refused", func(t *testing.T) {
		t.Parallel()
		t.Run("bodies that encoding/json reads as U+FFFD are refused", func(t *testing.T) {
			for _, body := range []string{
				"[\"\xff\"]", "[\"\xfe\"]", `["\ud800"]`, `["\udbff"]`, `["\udc00"]`, `["\ud800\u0041"]`, `["\ud800\ud800"]`,
				`["\ud800x"]`, `["\udc00\ud800"]`, "{\"\xff\":1}", `{"\ud800":1}`, "[\"\xed\xa0\x80\"]", "[\"\xc0\xaf\"]",
				`{"a":{"b":["ok","\udfff"]}}`,
			} {
				_, err := idempotency.NewFingerprint("POST", "/payments", "", []byte(body), 0)
				assert.ErrorIs(t, err, idempotency.ErrJSONNotUTF8, "%q", body)
			}
		})
		t.Run("U+FFFD itself and paired surrogates are read as written", func(t *testing.T) {
			for _, body := range []string{`["\ufffd"]`, "[\"\ufffd\"]", `["\ud83d\ude00"]`, `["a\udbff\udfffb"]`, `"\\ud800"`} {
				_, err := idempotency.NewFingerprint("POST", "/payments", "", []byte(body), 0)
				assert.NoError(t, err, "%q", body)
			}
		})
		t.Run("bytes that are not JSON are fingerprinted as they are, whatever they hold", func(t *testing.T) {
			a, err := idempotency.NewFingerprint("POST", "/payments", "", []byte("amount=\xff"), 0)
			require.NoError(t, err)
			b, err := idempotency.NewFingerprint("POST", "/payments", "", []byte("amount=\xfe"), 0)
			require.NoError(t, err)
			assert.NotEqual(t, a, b)
		})
	})

	t.Run("JSON nested past the depth limit is refused", func(t *testing.T) {
		t.Parallel()
		_, err := idempotency.NewFingerprint("POST", "/p", "", nested(idempotency.DefaultMaxDepth, 0), 0)
		assert.NoError(t, err, "at the default limit")
		_, err = idempotency.NewFingerprint("POST", "/p", "", nested(idempotency.DefaultMaxDepth+1, 0), 0)
		assert.ErrorIs(t, err, idempotency.ErrJSONTooDeep, "past the default limit")
		_, err = idempotency.NewFingerprint("POST", "/p", "", []byte(`[[[1]]]`), 2)
		assert.ErrorIs(t, err, idempotency.ErrJSONTooDeep, "past a configured limit")
		_, err = idempotency.NewFingerprint("POST", "/p", "", []byte(`[[1],[2]]`), 2)
		assert.NoError(t, err, "at a configured limit")
		_, err = idempotency.NewFingerprint("POST", "/p", "", []byte(strings.Repeat("[", 20000)), 0)
		assert.NoError(t, err, "not JSON: hashed raw")
	})

	// The query is part of the fingerprint, as a handler reads it through
	// url.Values: parameter order does not matter, the order of a repeated
	// name's values does, and encodings of one value are one value.
	t.Run("the query is taken canonically", func(t *testing.T) {
		t.Parallel()
		const body = `{"amount":1500}`
		var values []string
		for i := range 40 {
			values = append(values, fmt.Sprintf("a=%d", i), fmt.Sprintf("m%d=%d", i%3, i))
		}
		manyValues := strings.Join(values, "&")
		fp := func(query string) idempotency.Fingerprint {
			f, err := idempotency.NewFingerprint("POST", "/payments", query, []byte(body), 0)
			require.NoError(t, err)
			return f
		}
		for _, c := range []struct {
			name, a, b string
			same       bool
		}{
			{"another value", "param2=b", "param2=c", false},
			{"a parameter added", "", "param2=b", false},
			{"a name in another case", "a=1", "A=1", false},
			{"repeated values reordered", "a=1&a=2", "a=2&a=1", false},
			{"a value moved to another name", "a=1&b=2", "a=2&b=1", false},
			{"undecodable, another spelling", "a=%zz", "a=%zy", false},
			{"parameters reordered", "param1=a&param2=b", "param2=b&param1=a", true},
			{"repeated values keep their order among others", "a=1&b=2&a=3", "b=2&a=1&a=3", true},
			{"percent-encoding", "name=%7Eada&x=a%20b", "name=~ada&x=a+b", true},
			{"empty parameters", "a=1&&b=2&", "a=1&b=2", true},
			{"a name without =", "flag&a=1", "flag=&a=1", true},
			{"nothing after the ?", "", "", true},
			{"many values of one name keep their order", "z=x&" + manyValues, manyValues + "&z=x", true},
		} {
			t.Run(c.name, func(t *testing.T) {
				if c.same {
					assert.Equal(t, fp(c.a), fp(c.b), "?%s and ?%s", c.a, c.b)
				} else {
					assert.NotEqual(t, fp(c.a), fp(c.b), "?%s and ?%s", c.a, c.b)
				}
			})
		}
		assert.NotEqual(t, fp("a=1"), fingerprint(t, "POST", "/payments?a=1", body), "the query is not part of the path")
	})

	// A record whose fingerprint was made by another version of the
	// algorithm (a later release's, or none) never matches a request, even
	// when its bytes equal the request's fingerprint: the request is 422,
	// nothing replays and nothing runs or is taken over.
	t.Run("a record of another version never matches", func(t *testing.T) {
		t.Parallel()
		fp, err := idempotency.NewFingerprint(http.MethodPost, "/things", "a=1", []byte("x"), 0)
		require.NoError(t, err)
		for _, v := range []int{0, idempotency.FingerprintVersion + 1} {
			for _, status := range []string{idempotency.StatusCompleted, idempotency.StatusInProgress} {
				t.Run(fmt.Sprintf("a %s record of version %d is 422", status, v), func(t *testing.T) {
					t.Parallel()
					store := &idempotency.MemoryStore{}
					c := &counter{status: 201}
					m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0)})
					id := idempotency.ID{Principal: "", Key: "k"}
					// An IN_PROGRESS record's lease has ended: a record of the
					// request's version would be taken over and run.
					_, inserted, err := store.Insert(context.Background(), &idempotency.Record{ID: id, Fingerprint: fp, FingerprintVersion: v,
						Status: idempotency.StatusInProgress, StableID: "st", Owner: "w", LockedUntil: t0.Add(-time.Second),
						CreatedAt: t0.Add(-time.Minute), ExpiresAt: t0.Add(time.Hour)})
					require.NoError(t, err)
					require.True(t, inserted)
					if status == idempotency.StatusCompleted {
						require.NoError(t, store.Complete(context.Background(), id, "w", &idempotency.Response{StatusCode: 201, Body: []byte("old")}, nil))
					}
					w := serveURL(m, "/things?a=1", "k", "x")
					assert.Equal(t, http.StatusUnprocessableEntity, w.Code, w.Body.String())
					assert.Contains(t, w.Body.String(), idempotency.TypeKeyReused)
					assert.Zero(t, c.runs.Load(), "the handler ran")
				})
			}
		}
		t.Run("a record of this version matches", func(t *testing.T) {
			t.Parallel()
			store := &idempotency.MemoryStore{}
			c := &counter{status: 201}
			m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0)})
			require.Equal(t, 201, serveURL(m, "/things?a=1", "k", "x").Code)
			rec, _, err := store.Insert(context.Background(), &idempotency.Record{ID: idempotency.ID{Key: "k"}, ExpiresAt: t0.Add(time.Hour)})
			require.NoError(t, err)
			require.NotNil(t, rec)
			assert.Equal(t, idempotency.FingerprintVersion, rec.FingerprintVersion)
			assert.Equal(t, fp, idempotency.Fingerprint(rec.Fingerprint), "the fingerprint stored is NewFingerprint's")
			assert.Equal(t, "true", serveURL(m, "/things?a=1", "k", "x").Header().Get(idempotency.HeaderReplayed))
		})
	})
}

// nested returns a JSON body of depth objects, each with a padding member
// sorted after the nested one, about size bytes in all.
func nested(depth, size int) []byte {
	pad := max(0, (size-depth*len(`{"p":"","n":}`))/depth)
	p := strings.Repeat("x", pad)
	var b strings.Builder
	for range depth {
		b.WriteString(`{"p":"` + p + `","n":`)
	}
	b.WriteString("0")
	b.WriteString(strings.Repeat("}", depth))
	return []byte(b.String())
}

// BenchmarkFingerprintDepth fingerprints 1 MiB bodies of nested objects:
// the time per byte stays flat as the depth grows.
func BenchmarkFingerprintDepth(b *testing.B) {
	for _, depth := range []int{10, 100, 1000, 9999} {
		body := nested(depth, 1<<20)
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := idempotency.NewFingerprint("POST", "/p", "", body, 10000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFingerprintWide fingerprints a 1 MiB object of about 95,000
// members, whose canonical form sorts them all.
func BenchmarkFingerprintWide(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("{")
	for i := 0; sb.Len() < 1<<20; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `"k%d":0`, i*7919%1000003)
	}
	sb.WriteString("}")
	body := []byte(sb.String())
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := idempotency.NewFingerprint("POST", "/p", "", body, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzFingerprintQuery: any query string fingerprints without failing, and
// empty parameters and the order of two different names change nothing.
func FuzzFingerprintQuery(f *testing.F) {
	for _, q := range []string{"", "a=1", "param1=a&param2=b", "a=1&a=2", "a=%zz;b", "x=a+b&name=%7E", "&&=&"} {
		f.Add(q, "b=2")
	}
	f.Fuzz(func(t *testing.T, q, other string) {
		fp := func(query string) idempotency.Fingerprint {
			got, err := idempotency.NewFingerprint("POST", "/p", query, nil, 0)
			require.NoError(t, err)
			return got
		}
		base := fp(q)
		assert.Equal(t, base, fp("&"+q+"&"), "empty parameters are dropped")
		// A name that starts with two 0xff bytes sorts after every name of q
		// (which has none that starts so: no 0xff, no escapes), so moving
		// that parameter from the end to the front is the same query.
		if !strings.Contains(q, "%") && strings.IndexByte(q, 0xff) < 0 && !strings.Contains(other, "&") && !strings.Contains(other, ";") && !strings.Contains(other, "%") && !strings.Contains(other, "+") {
			extra := "\xff\xff" + other
			assert.Equal(t, fp(q+"&"+extra), fp(extra+"&"+q), "?%s with %q moved", q, extra)
		}
	})
}
