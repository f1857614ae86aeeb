package idempotency_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/idempotency"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := idempotency.NewFingerprint("POST", "/payments", []byte(`{"a":1,"b":[1,2],"c":{"x":"y"}}`))
	same := []struct{ name, body string }{
		{"keys reordered", `{"c":{"x":"y"},"b":[1,2],"a":1}`},
		{"whitespace", " {\n\t\"a\" : 1 , \"b\" : [ 1 , 2 ] , \"c\" : { \"x\" : \"y\" } }\n"},
		{"escaped string", `{"a":1,"b":[1,2],"c":{"x":"\u0079"}}`},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, base, idempotency.NewFingerprint("POST", "/payments", []byte(tt.body)))
		})
	}
	differ := []struct{ name, method, path, body string }{
		{"value", "POST", "/payments", `{"a":2,"b":[1,2],"c":{"x":"y"}}`},
		{"array order", "POST", "/payments", `{"a":1,"b":[2,1],"c":{"x":"y"}}`},
		{"number written differently", "POST", "/payments", `{"a":1.0,"b":[1,2],"c":{"x":"y"}}`},
		{"method", "PATCH", "/payments", `{"a":1,"b":[1,2],"c":{"x":"y"}}`},
		{"path", "POST", "/payments/1", `{"a":1,"b":[1,2],"c":{"x":"y"}}`},
	}
	for _, tt := range differ {
		t.Run(tt.name, func(t *testing.T) {
			assert.NotEqual(t, base, idempotency.NewFingerprint(tt.method, tt.path, []byte(tt.body)))
		})
	}
	t.Run("raw bodies", func(t *testing.T) {
		a := idempotency.NewFingerprint("POST", "/x", []byte("a=1&b=2"))
		assert.Equal(t, a, idempotency.NewFingerprint("POST", "/x", []byte("a=1&b=2")))
		assert.NotEqual(t, a, idempotency.NewFingerprint("POST", "/x", []byte("b=2&a=1")))
	})
	t.Run("no ambiguity between fields", func(t *testing.T) {
		assert.NotEqual(t, idempotency.NewFingerprint("POST", "/ab", nil), idempotency.NewFingerprint("POST/", "ab", nil))
	})
}
