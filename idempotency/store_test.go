package idempotency_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/idempotency"
)

// TestPrincipalDigest checks the digest that stored records are found by.
func TestPrincipalDigest(t *testing.T) {
	// Stored records are found by this digest across versions, so its value
	// never changes: lower-case hex SHA-256 of "idem.principal.v1:" and the
	// principal, of any length.
	t.Run("is the documented SHA-256 of any principal", func(t *testing.T) {
		for principal, want := range map[string]string{
			"":                       "ce66522780a8260d6e0a1fedaf788c05f9f13c15c1838a11aab25d3ffab0772f",
			"acct_1":                 "c15efbf54dbc1866a1465f74cdfe0b2b4583bf2b1b04fae9fd736871b6601ac0",
			strings.Repeat("x", 300): "0439e6a980f8584c50ad1cc6591317736d6cb6ac991808514879b0da6464949a",
		} {
			assert.Equal(t, want, idempotency.PrincipalDigest(principal), "principal of %d bytes", len(principal))
		}
	})
}
