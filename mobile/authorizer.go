package mobile

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Authorizer puts credentials on each attempt. Set it as Config.Authorizer
// before Open. Authorize returns the Authorization header's value for the
// attempt of the intent with the given key, such as "Bearer " + a fresh
// token. An empty value sends none. Credentials are asked for on every
// attempt and never stored with the intent. So a token that expires
// between a crash and the resume is refreshed.
//
// An error stops the call, and the attempt is not sent. In Java or Swift
// that error is a thrown exception. A value with a control character stops
// the call too, such as a token read with its trailing newline. That
// value is never shown. The Result's Kind is then KindAuthorizer. Its
// Outcome is OutcomeNotSent if no attempt of the intent was sent. It is
// OutcomeUnknown if one may have been. A redirect (307, 308) to another
// origin is sent without credentials, and the Authorizer is not asked.
//
// The server must see every attempt of an intent as the same caller. The
// contract scopes keys by the account a request acts for, not by its
// credential. So a refreshed token's retry replays. The fake server's
// test tokens ("Bearer test_<account>_<anything>") name their account for
// this. A server that scoped keys by the raw header would see a refreshed
// token as another caller. A retry after a refresh would then be a new
// payment.
type Authorizer interface {
	Authorize(key string) (string, error)
}

// authorizerOf is a as idem.Config.Authorizer, which the call runs before
// each attempt. A failure ends the call not sent if no attempt of the
// intent wrote its request. Otherwise the outcome is unknown. The failure
// is also told to the call, which stops, SettleAll included. Its Result's
// Kind is KindAuthorizer.
func authorizerOf(a Authorizer) func(context.Context, string) (string, error) {
	if a == nil {
		return nil
	}
	return func(ctx context.Context, key string) (string, error) {
		v, err := a.Authorize(key)
		if err == nil && strings.ContainsFunc(v, isCTL) {
			// net/http would refuse it before it dials, on every
			// attempt. The value is a credential, so it is not shown.
			err = errors.New("its value is not a valid header field value: it has a control character (such as CR, LF or NUL)")
		}
		if err != nil {
			err = &authError{err: err}
			if f, ok := ctx.Value(authFailureKey{}).(func(error)); ok {
				f(err)
			}
			return "", err
		}
		return v, nil
	}
}

// authError is the Authorizer's failure, kept so the call can report it.
type authError struct{ err error }

func (e *authError) Error() string { return fmt.Sprintf("authorizer: %v", e.err) }
func (e *authError) Unwrap() error { return e.err }

// authFailureKey carries the call's function that records an Authorizer
// failure and stops the call. No retry can fix such a failure.
type authFailureKey struct{}

// isCTL reports a control character but tab, which RFC 9110 forbids in a
// header field value.
func isCTL(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }
