package idempotency

import "net/http"

// LookupNonceHeader is the header field of a lookup's nonce. A client's
// lookup by key carries a fresh nonce in it. On the fake server that is
// GET /payments?idempotency_key=K. Every answer to the lookup echoes the
// nonce as received. A cache that kept an earlier answer replays that
// lookup's nonce, or none. So a client trusts a "nothing was done" only
// from an answer that echoes its nonce (docs/CONTRACT.md,
// "Reconciling").
const LookupNonceHeader = "Idempotency-Lookup-Nonce"

// maxNonce bounds the nonce a lookup's answer echoes. A client's is 26
// characters. One longer, or not visible ASCII, is not echoed.
const maxNonce = 128

// MarkLookup marks the answer to r as the server's own. r is a lookup
// by key that the server serves itself. Call it before anything is
// written to w. It echoes key in Idempotency-Key as received. It echoes
// the request's nonce in LookupNonceHeader. It sets Cache-Control:
// no-store, so that no cache keeps the answer. The server still writes
// the miss itself. That is a 404 problem of type
// https://idem.dev/problems/idempotency-key-unused.
func MarkLookup(w http.ResponseWriter, r *http.Request, key string) {
	h := w.Header()
	h["Idempotency-Key"] = []string{key}
	h.Set("Cache-Control", "no-store")
	if n := r.Header.Values(LookupNonceHeader); len(n) == 1 && validNonce(n[0]) {
		h[LookupNonceHeader] = []string{n[0]}
	}
}

// validNonce reports a nonce of 1 to maxNonce visible ASCII characters.
func validNonce(n string) bool {
	if n == "" || len(n) > maxNonce {
		return false
	}
	for i := 0; i < len(n); i++ {
		if n[i] < 0x21 || n[i] > 0x7e {
			return false
		}
	}
	return true
}
