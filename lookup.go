package idem

import (
	"context"
	"crypto/rand"
	"net/http"
	"slices"
	"strings"
)

// lookupNonceHeader is the header field of each lookup's fresh nonce. The
// server's answers to a lookup echo the nonce in it. (See docs/CONTRACT.md,
// "Reconciling".) A cache on the path may have kept an earlier answer. It
// replays the nonce of the lookup it was given to, or none. So a miss that
// does not echo this lookup's nonce may be a kept one. It may be from before
// the payment, and it voids nothing. It is the contract's header
// (idempotency.LookupNonceHeader). It is spelled here so that the client
// does not import the server half.
const lookupNonceHeader = "Idempotency-Lookup-Nonce"

// lookupNonce returns a fresh nonce for one lookup. It is 26 characters of
// base32 from the system's random source. No cache has seen it.
func lookupNonce() string { return rand.Text() }

// lookupTrusted reports a lookup's 2xx (status) that is the server's word on
// key. The answer must be to this lookup, whose nonce is nonce. A cache on
// the path may ignore the query string. (A rule "cache everything" does.) It
// may then serve the lookup of another key. So an answer made for another
// lookup is refused. Such an answer echoes another nonce or another key.
//
// An answer that names the key is this intent's even if a cache kept it. It
// names the key by its echo, or in a body the Mark reads (MarkIncrease). A
// payment, once made, stays made. A recognizer that reads no key
// (MarkJSONID, MarkRecognizer) says nothing of the intent. Then the answer
// must echo this lookup's nonce and carry no Age field. An Age field (RFC
// 9111) says a cache served it. That cache may have copied the nonce from
// the request. A front that copies request header fields into its answer
// copies the lookup's attempt nonce too, which no server sends back. Such
// an answer is never trusted (reflected).
func (c *config) lookupTrusted(status int, h http.Header, body []byte, key, nonce string) bool {
	if reflected(h) {
		return false // a front copied the lookup's header fields (lookupRequest)
	}
	if len(h.Values(lookupNonceHeader)) > 0 && !echoesNonce(h, nonce) {
		return false
	}
	if len(h.Values("Idempotency-Key")) > 0 {
		return echoes(h, key)
	}
	if !c.trusted(status, h, body, key) {
		return false
	}
	return c.ownNamesKey || h.Get("Age") == "" && echoesNonce(h, nonce)
}

// echoesNonce reports an answer that echoes nonce, once, as sent.
func echoesNonce(h http.Header, nonce string) bool {
	vs := h.Values(lookupNonceHeader)
	return len(vs) == 1 && vs[0] == nonce
}

// lookupHeader returns the header fields of the lookup of the intent with
// key. stored is the intent's stored header. The server scopes keys by
// caller (docs/CONTRACT.md). So the lookup must act for the caller the
// intent's attempts acted for. An anonymous lookup gets the anonymous
// caller's typed miss. That miss would void a paid intent. So the lookup
// carries the stored fields that may name the caller. (An account header is
// one.) It carries the Authorizer's credentials for key too. They are asked
// fresh, as before each attempt. Fields about the body or the intent's
// preconditions are left out. The lookup has no body, and reads another
// resource. A failing Authorizer's error is returned, and nothing is sent.
func (c *Client) lookupHeader(ctx context.Context, stored http.Header, key string) (http.Header, error) {
	h := make(http.Header, len(stored)+3)
	for name, vs := range stored {
		if !lookupCarries(name) {
			continue
		}
		h[name] = slices.Clone(vs)
	}
	if c.authorize == nil {
		return h, nil
	}
	v, err := c.authorize(ctx, key)
	switch {
	case err != nil:
		return nil, &authorizerError{err: err}
	case v == "":
		h.Del("Authorization")
	default:
		h.Set("Authorization", v)
	}
	return h, nil
}

// lookupCarries reports a stored header field the lookup sends as well.
func lookupCarries(name string) bool {
	name = http.CanonicalHeaderKey(name)
	switch {
	case strings.HasPrefix(name, "Content-"), strings.HasPrefix(name, "If-"):
		// The body's fields, and the changed resource's preconditions.
		return false
	}
	switch name {
	case "Digest", "Repr-Digest", "Want-Digest", "Idempotency-Key", "Expect", "Transfer-Encoding", "Trailer", "Cache-Control", lookupNonceHeader:
		// The body's fields, the attempt's own, or the lookup's own (set
		// after).
		return false
	case "Accept-Encoding":
		// Left to net/http, which then decodes the answer. A mark read from
		// the body (MarkJSONID) needs it decoded.
		return false
	}
	return true
}
