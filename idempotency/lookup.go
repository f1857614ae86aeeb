package idempotency

import "net/http"

// LookupNonceHeader is the header field in which a client's lookup by key
// (GET /payments?idempotency_key=K on the fake server) carries a fresh
// nonce, and in which every answer to it echoes the nonce as received. A
// cache that kept an earlier answer replays that lookup's nonce, or none,
// so a client trusts a "nothing was done" only from an answer that
// echoes the nonce it sent (docs/CONTRACT.md, "Reconciling").
const LookupNonceHeader = "Idempotency-Lookup-Nonce"

// maxNonce bounds the nonce a lookup's answer echoes: a client's is 26
// characters; one longer, or not visible ASCII, is not echoed.
const maxNonce = 128

// MarkLookup marks the answer to r, a lookup by key that a server serves
// itself, as the server's own, before anything is written to w: key
// echoed in Idempotency-Key as received, the request's nonce echoed in
// LookupNonceHeader, and Cache-Control: no-store, so that no cache keeps
// it. Its miss is still the server's to write: a 404 problem of type
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
