package mobile

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Authorizer puts credentials on each attempt; set it as Config.Authorizer
// before Open. Authorize returns the value of the Authorization header for
// the attempt of the intent with the given key, such as "Bearer " + a
// fresh token; "" sends none. Credentials are asked for on every attempt
// and never stored with the intent, so a token that expires between a
// crash and the resume is refreshed. An error (an exception thrown in Java
// or Swift) stops the call, and the attempt is not sent; so does a value
// with a control character (a token read with its trailing newline),
// which is never shown. The Result's Kind
// is KindAuthorizer, and its Outcome OutcomeNotSent if no attempt of the
// intent was sent, OutcomeUnknown if one may have been. An attempt that a
// redirect (307, 308) sends to another origin (scheme, host or port) than
// the call's URL is sent without credentials, and the Authorizer is not
// asked.
//
// The server must see every attempt of an intent as the same caller: the
// contract scopes keys by the account a request acts for, not by its
// credential, so a refreshed token's retry replays. The fake server's test
// tokens ("Bearer test_<account>_<anything>") name their account for this.
// A server that scoped keys by the raw Authorization value would take a
// refreshed token for another caller: a retry after a refresh would be a
// new payment, and the lookup would not find the first.
type Authorizer interface {
	Authorize(key string) (string, error)
}

// authorizerOf is a as idem.Config.Authorizer, which the call runs before
// each attempt: a failure ends the call not sent if no attempt of the
// intent wrote its request, and with the outcome unknown otherwise. The
// failure is also told to the call, which stops (SettleAll included), and
// its Result's Kind is KindAuthorizer.
func authorizerOf(a Authorizer) func(context.Context, string) (string, error) {
	if a == nil {
		return nil
	}
	return func(ctx context.Context, key string) (string, error) {
		v, err := a.Authorize(key)
		if err == nil && strings.ContainsFunc(v, isCTL) {
			// net/http would refuse it before it dials, on every
			// attempt. The value is a credential: it is not shown.
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
// failure and stops the call: no retry can fix it.
type authFailureKey struct{}

// isCTL reports a control character but tab, which RFC 9110 forbids in a
// header field value.
func isCTL(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }
