package idem

import (
	"crypto/rand"
	"net/http"
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

// echoesNonce reports an answer that echoes nonce, once, as sent.
func echoesNonce(h http.Header, nonce string) bool {
	vs := h.Values(lookupNonceHeader)
	return len(vs) == 1 && vs[0] == nonce
}
