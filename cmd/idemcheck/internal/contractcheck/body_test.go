package contractcheck

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBody checks the bodies the check derives from the one it is given.
func TestBody(t *testing.T) {
	// The same object, members reversed, other whitespace; numbers and
	// nested values kept exactly as sent.
	t.Run("the same object is written another way", func(t *testing.T) {
		in := `{"amount":1500, "meta":{"b":1,"a":[1,2]},"big":12345678901234567890,"s":"x\u00e9"}`
		out, err := reserialise([]byte(in))
		require.NoError(t, err)
		assert.Equal(t, "{\n  \"s\" : \"x\\u00e9\",\n  \"big\" : 12345678901234567890,\n  \"meta\" : {\"b\":1,\"a\":[1,2]},\n  \"amount\" : 1500\n}", string(out))
		var a, b any
		require.NoError(t, json.Unmarshal([]byte(in), &a))
		require.NoError(t, json.Unmarshal(out, &b))
		assert.Equal(t, a, b)
	})

	// The first integer member plus one, else the first string member
	// changed; a body with neither, or no JSON object, is an error.
	t.Run("the first integer or string member is changed", func(t *testing.T) {
		for _, tt := range []struct{ in, want, err string }{
			{`{"currency":"AZN","amount":1500}`, `{"currency":"AZN","amount":1501}`, ""},
			{`{"price":1.5,"note":"a"}`, `{"price":1.5,"note":"a (changed)"}`, ""},
			{`{"ok":true}`, "", "the body has no integer or string member to change"},
			{`[1]`, "", "the body is not a JSON object"},
			{`{"a":1} {}`, "", "the body has data after its JSON object"},
		} {
			out, err := changeBody([]byte(tt.in))
			if tt.err != "" {
				assert.EqualError(t, err, tt.err, tt.in)
				continue
			}
			require.NoError(t, err, tt.in)
			assert.Equal(t, tt.want, string(out))
		}
	})

	// A JSON object cut short is malformed JSON.
	t.Run("an object cut short is malformed JSON", func(t *testing.T) {
		out, err := invalidBody([]byte("{\"amount\":1500}\n"))
		require.NoError(t, err)
		assert.Equal(t, `{"amount":1500`, string(out))
		assert.False(t, json.Valid(out))
		_, err = invalidBody([]byte("amount=1500"))
		assert.Error(t, err)
	})
}
