package idem

import (
	"context"
	"crypto/rand"
	"net/http"
	"slices"
	"strings"
)

// lookupNonceHeader is the header field in which each lookup carries a
// fresh nonce, and in which the server's answers to it echo the nonce
// (docs/CONTRACT.md, "Reconciling"). A cache on the path that kept an
// earlier answer replays the nonce of the lookup it was given to, or none:
// so a miss that does not echo this lookup's nonce may be a kept one, from
// before the payment, and voids nothing. It is the contract's
// (idempotency.LookupNonceHeader), spelled here so that the client does
// not import the server half.
const lookupNonceHeader = "Idempotency-Lookup-Nonce"

// lookupNonce returns a fresh nonce for one lookup: 26 characters of
// base32 from the system's random source, which no cache has seen.
func lookupNonce() string { return rand.Text() }

// lookupTrusted reports a lookup's 2xx (status) that is the server's word
// on key, given to this lookup, whose nonce is nonce. A cache on the path
// may ignore the query string and serve the lookup of another key (a rule
// "cache everything"). So an answer made for another lookup is refused: it
// echoes another nonce or another key. An answer that names the key, by
// its echo or in a body the Mark's recognizer reads (MarkIncrease), is
// this intent's even if a cache kept it: a payment, once made, stays made.
// A recognizer that reads no key (MarkJSONID, MarkRecognizer) says nothing
// of which intent the answer is for: the answer must echo this lookup's
// nonce, and carry no Age field (RFC 9111: a cache served it, and may have
// copied the nonce from the request). What remains possible: a cache that
// reflects request header fields into a kept answer and adds no Age.
func (c *config) lookupTrusted(status int, h http.Header, body []byte, key, nonce string) bool {
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
// key, whose stored header is stored. The server scopes keys by caller
// (docs/CONTRACT.md), so the lookup must act for the caller the intent's
// attempts acted for: an anonymous lookup gets the anonymous caller's
// typed miss, which would void a paid intent. So it carries the stored
// fields that may name the caller (an account header, say), and the
// Authorizer's credentials for key, asked fresh as before each attempt.
// Fields about the body or the intent's preconditions are left out: the
// lookup has no body, and reads another resource. A failing Authorizer
// is returned, and nothing is sent.
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
		// The body's, and the changed resource's preconditions.
		return false
	}
	switch name {
	case "Digest", "Repr-Digest", "Want-Digest", "Idempotency-Key", "Expect", "Transfer-Encoding", "Trailer", "Cache-Control", lookupNonceHeader:
		// The body's, the attempt's own, or the lookup's own (set after).
		return false
	case "Accept-Encoding":
		// Left to net/http, which then decodes the answer: a mark read
		// from the body (MarkJSONID) needs it decoded.
		return false
	}
	return true
}
