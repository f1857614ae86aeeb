package idempotency

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var keyCases = []struct {
	name, in, want string // want "" means invalid
}{
	{"bare", "order-1", "order-1"},
	{"sf-string", `"order-1"`, "order-1"},
	{"sf-string with escapes", `"a\"b\\c"`, `a"b\c`},
	{"sf-string with parameters", `"k";v=1`, "k"},
	{"sf-string with trailing space", `"k"  `, "k"},
	{"bare with a quote inside", `a"b`, `a"b`},
	{"all visible ASCII", "!~", "!~"},
	{"255 characters", strings.Repeat("x", 255), strings.Repeat("x", 255)},
	{"uuid", "8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
	{"empty", "", ""},
	{"empty sf-string", `""`, ""},
	{"256 characters", strings.Repeat("x", 256), ""},
	{"space", "a b", ""},
	{"tab", "a\tb", ""},
	{"DEL", "a\x7f", ""},
	{"non-ASCII", "açar", ""},
	{"unterminated sf-string", `"abc`, ""},
	{"sf-string then junk", `"abc" x`, ""},
	{"sf-string with space", `"a b"`, ""},
	{"sf-string with bad escape", `"a\b"`, ""},
	{"quoted token is not a string", `"`, ""},
}

// TestKey checks how an Idempotency-Key is read: as an sf-string or a
// token, once per request, in canonical form when it must be a UUID.
func TestKey(t *testing.T) {
	t.Run("ParseKey reads an sf-string or a token and refuses the rest", func(t *testing.T) {
		t.Parallel()
		for _, tt := range keyCases {
			t.Run(tt.name, func(t *testing.T) {
				got, err := ParseKey(tt.in)
				if tt.want == "" {
					assert.ErrorIs(t, err, errKeyInvalid)
					assert.Empty(t, got)
					return
				}
				require.NoError(t, err)
				assert.Equal(t, tt.want, got)
			})
		}
	})

	t.Run("the header is read once and a UUID in canonical form", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name   string
			values []string
			uuid   bool
			want   string
			err    error
		}{
			{"missing", nil, false, "", errKeyMissing},
			{"twice", []string{"a", "a"}, false, "", errKeyInvalid},
			{"one", []string{"a"}, false, "a", nil},
			{"uuid mode, upper-case uuid compares in canonical form", []string{`"8E03978E-40D5-43E8-BC93-6894A57F9324"`}, true, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
			{"uuid mode, mixed-case uuid compares in canonical form", []string{"8e03978E-40d5-43E8-bc93-6894a57F9324"}, true, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
			{"any-key mode, upper-case uuid compares byte for byte", []string{"8E03978E-40D5-43E8-BC93-6894A57F9324"}, false, "8E03978E-40D5-43E8-BC93-6894A57F9324", nil},
			{"uuid mode, braces", []string{"{8e03978e-40d5-43e8-bc93-6894a57f9324}"}, true, "", errKeyInvalid},
			{"uuid mode, urn", []string{"urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324"}, true, "", errKeyInvalid},
			{"uuid mode, other", []string{"order-1"}, true, "", errKeyInvalid},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				h := http.Header{}
				for _, v := range tt.values {
					h.Add("Idempotency-Key", v)
				}
				got, err := parseKeyHeader(h, tt.uuid)
				if tt.err != nil {
					assert.ErrorIs(t, err, tt.err)
					return
				}
				require.NoError(t, err)
				assert.Equal(t, tt.want, got)
			})
		}
	})
}

func FuzzParseKey(f *testing.F) {
	for _, tt := range keyCases {
		f.Add(tt.in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := ParseKey(in)
		if err != nil {
			if key != "" {
				t.Fatalf("%q: error with a key", in)
			}
			return
		}
		if len(key) < 1 || len(key) > maxKeyLen {
			t.Fatalf("%q: key of length %d", in, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("%q: key %q has byte 0x%02x", in, key, key[i])
			}
		}
		// A bare key parses to itself; a key that is also a valid bare key
		// means the same when quoted.
		if in[0] != '"' && key != in {
			t.Fatalf("bare %q parsed as %q", in, key)
		}
		if !strings.ContainsAny(key, `"\`) {
			again, err := ParseKey(`"` + key + `"`)
			if err != nil || again != key {
				t.Fatalf("%q quoted: %q, %v", key, again, err)
			}
		}
	})
}
