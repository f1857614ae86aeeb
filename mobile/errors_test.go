package mobile

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The kinds are strings an app compares, with no constants of their own:
// these are the values ErrorKind's comment promises.
func TestErrorKindReadsTheMessage(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"config", "locked", "storage", "not-found", "closed", "canceled", "authorizer"} {
		assert.Equal(t, kind, ErrorKind(newError(kind, "x").Error()))
	}
	for _, kind := range []string{kindConfig, kindLocked, kindStorage, kindNotFound, kindClosed, kindCanceled, kindAuthorizer} {
		assert.Equal(t, kind, ErrorKind(newError(kind, "x").Error()), "every kind the package makes is one ErrorKind returns")
	}
	assert.Equal(t, "internal", ErrorKind(newError(kindInternal, "x").Error()))
	assert.Equal(t, "internal", ErrorKind("idem[bogus]: x"))
	assert.Equal(t, "internal", ErrorKind("idem[locked] x"), "no colon after the kind")
	assert.Equal(t, "internal", ErrorKind("java.io.IOException"))
	assert.Equal(t, "internal", ErrorKind(""))
}
