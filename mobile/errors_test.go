package mobile

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// foreignError stands for an exception that Java or Swift code threw and
// the app passed to ErrorKind: calling its Error would call back into the
// app's runtime.
type foreignError struct{ t *testing.T }

func (e foreignError) Error() string {
	e.t.Error("ErrorKind called Error on an error it did not make")
	return "java.io.IOException"
}

// TestErrorKind: the kind of a call's error is read from the error
// itself, never from its message.
func TestErrorKind(t *testing.T) {
	t.Parallel()
	t.Run("every kind the package makes reads back", func(t *testing.T) {
		t.Parallel()
		for _, kind := range []string{KindBadInput, KindLocked, KindStorage, KindNotFound, KindClosed, KindCanceled, KindInternal} {
			assert.Equal(t, kind, ErrorKind(newError(kind, "x")))
			assert.Equal(t, kind, ErrorKind(fmt.Errorf("wrapped: %w", newError(kind, "x"))))
		}
	})
	t.Run("the message does not decide", func(t *testing.T) {
		t.Parallel()
		assert.Equal(t, KindInternal, ErrorKind(errors.New("idem[locked]: the directory is in use")))
		assert.Equal(t, KindLocked, ErrorKind(newError(KindLocked, "idem[config]: x")))
		assert.NotContains(t, newError(KindLocked, "the directory is in use").Error(), "locked",
			"the message is for logs; the kind is not in it to be parsed")
	})
	t.Run("an exception of another origin is internal, read without calling it", func(t *testing.T) {
		t.Parallel()
		assert.Equal(t, KindInternal, ErrorKind(foreignError{t}))
		assert.Equal(t, "", ErrorKind(nil))
	})
}
