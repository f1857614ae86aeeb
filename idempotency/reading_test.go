package idempotency_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idempotency"
)

// TestJSONReadingOf checks the fingerprint's reading of a body, handed
// to the validation hook.
func TestJSONReadingOf(t *testing.T) {
	// The validation hook finds the fingerprint's reading of a JSON body on
	// the request (JSONReadingOf), so that it need not parse the body again;
	// the body still reads in full, in the hook and in the handler, which
	// gets no reading.
	t.Run("the validation hook gets the fingerprint's reading", func(t *testing.T) {
		type member struct{ name, value string }
		for _, tt := range []struct {
			body    string
			json    bool
			members []member // nil: not an object
		}{
			{` {"b":"x\u0041","a":[1],"c":{"d":1},"ę":-1.5e3,"\u0066":null} `, true,
				[]member{{"a", "["}, {"b", `"x\u0041"`}, {"c", "{"}, {"f", "null"}, {"ę", "-1.5e3"}}},
			{`{}`, true, []member{}},
			{`[{"a":1}]`, true, nil},
			{`"s"`, true, nil},
			{`{"a":1`, false, nil},
			{``, false, nil},
		} {
			var inHook, inHandler bool
			h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, inHandler = idempotency.JSONReadingOf(r)
				b, err := io.ReadAll(r.Body)
				require.NoError(t, err)
				assert.Equal(t, tt.body, string(b), "the handler reads the body in full")
				w.WriteHeader(http.StatusCreated)
			}), idempotency.Config{Store: &idempotency.MemoryStore{}, Principal: anyone,
				Validate: func(r *http.Request, body []byte) (any, *idempotency.Problem) {
					rd, ok := idempotency.JSONReadingOf(r)
					inHook = ok
					if ok {
						var got []member
						if n := rd.Len(); n >= 0 {
							got = []member{}
							for i := range n {
								name, value := rd.Member(i)
								got = append(got, member{string(name), string(value)})
							}
						}
						assert.Equal(t, tt.members, got, tt.body)
					}
					b, err := io.ReadAll(r.Body)
					require.NoError(t, err)
					assert.Equal(t, tt.body, string(b), "the hook reads the body in full")
					return nil, nil
				}})
			assert.Equal(t, http.StatusCreated, serve(h, "k1", tt.body).Code, tt.body)
			assert.Equal(t, tt.json, inHook, "a reading in the hook of %q", tt.body)
			assert.False(t, inHandler, "a reading in the handler of %q", tt.body)
		}
	})
}
