package mobile

import (
	"context"
	"fmt"
	"net/http"
	"strings"
)

// Authorizer puts credentials on each attempt; set it as Config.Authorizer
// before Open. Authorize returns the value of the Authorization header for
// the attempt of the intent with the given key, such as "Bearer " + a
// fresh token; "" sends none. Credentials are asked for on every attempt
// and never stored with the intent, so a token that expires between a
// crash and the resume is refreshed. An error (an exception thrown in Java
// or Swift) stops the call with an error of kind "authorizer"; the attempt
// is not sent. An attempt that a redirect (307, 308) sends to another
// origin (scheme, host or port) than the call's URL is sent without
// credentials, and the Authorizer is not asked.
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
// failure is also told to the call, which reports it as a device error of
// kind "authorizer" when no attempt of it went on the wire.
func authorizerOf(a Authorizer) func(context.Context, string) (string, error) {
	if a == nil {
		return nil
	}
	return func(ctx context.Context, key string) (string, error) {
		v, err := a.Authorize(key)
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

// authTransport asks the Authorizer, if any, for each attempt's
// credentials. The facade's own Client sets none: its call asks
// (authorizerOf), and the transport only tells that an attempt went on
// the wire.
type authTransport struct {
	base http.RoundTripper
	auth Authorizer
}

// authError is the Authorizer's failure, kept so the call can report it.
type authError struct{ err error }

func (e *authError) Error() string { return fmt.Sprintf("authorizer: %v", e.err) }
func (e *authError) Unwrap() error { return e.err }

func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	a := t.auth
	if a == nil || offOrigin(req) {
		forwarded(req)
		return t.base.RoundTrip(req)
	}
	v, err := a.Authorize(req.Header.Get("Idempotency-Key"))
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		err = &authError{err: err}
		if f, ok := req.Context().Value(authFailureKey{}).(func(error)); ok {
			f(err)
		}
		return nil, err
	}
	if v != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", v)
	}
	forwarded(req)
	return t.base.RoundTrip(req)
}

// offOrigin reports a request that a redirect sent to another origin
// (scheme, host or port) than the call's first request: net/http drops
// its Authorization header, and the Authorizer is not asked to put it
// back, so the user's credentials go to the API's origin alone.
func offOrigin(req *http.Request) bool {
	first := req
	for first.Response != nil && first.Response.Request != nil {
		first = first.Response.Request
	}
	return req.URL.Scheme != first.URL.Scheme || !strings.EqualFold(req.URL.Host, first.URL.Host)
}

// authFailureKey carries the call's function that records an Authorizer
// failure and stops the call: no retry can fix it.
type authFailureKey struct{}

// authForwardedKey carries, in a call's context, what to tell when one of
// its attempts passes the Authorizer and goes on the wire.
type authForwardedKey struct{}

func forwarded(req *http.Request) {
	if f, ok := req.Context().Value(authForwardedKey{}).(func(bool)); ok {
		f(true)
	}
}
