package idem

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Server describes the app's server to a Client: how to ask it what became
// of a key, how it spells and keeps keys, and what its answers look like.
// It is Config.Server. Mark is required: New refuses a Server without
// one. Every other field left zero keeps the default its comment gives:
// a Server with only its Mark follows the contract (docs/CONTRACT.md) and
// has no lookup.
type Server struct {
	// Mark says how the server marks its answers as its own: a preset
	// (MarkEcho for idem's middleware and servers that follow the
	// contract, MarkStripe, MarkAdyen, MarkIncrease), MarkJSONID for a
	// plain server whose answers carry the resource's id, or
	// MarkRecognizer. An answer without the mark could come from a CDN, a
	// gateway or a captive portal in front of the server, and idem never
	// lets such an answer settle an intent (see the package
	// documentation, "Whose word settles an intent"). New refuses a Server
	// without a Mark, so that a server that marks nothing is found at
	// setup, not at the first payment.
	Mark Mark

	// Lookup returns the URL of a GET that asks the server what became of
	// key without sending the intent again: it answers 2xx with the effect
	// made under key, or 404 when there is none. Reconcile and Settle use
	// it; it is the one place an app builds that URL. Without a lookup
	// (Lookup nil and LookupQuery empty), an intent too old to send again
	// cannot be settled.
	Lookup func(req Request, key string) string
	// LookupQuery is the lookup of a server that finds the effect of a key
	// at the intent's own URL, with the key in the query parameter it
	// names: for an intent that POSTs to https://api.example/payments,
	// LookupQuery "idempotency_key" asks
	// GET https://api.example/payments?idempotency_key=K, as the contract
	// does. The intent's query is kept as sent, in its order and spelling,
	// and the key parameter appended to it; a parameter of that name
	// already in the intent's URL is replaced. New refuses a Server with both Lookup and LookupQuery, and a
	// LookupQuery that is not a parameter's name: one with a space, a
	// control character, =, &, ? or # in it.
	LookupQuery string

	// QuotedKey sends the key as an RFC 8941 sf-string ("..."), as the
	// IETF draft writes it. False sends the bare value deployed APIs
	// expect.
	QuotedKey bool

	// Retention is how long the server keeps idempotency records, and
	// RetentionMargin how long before that the client stops sending a key.
	// An intent older than Retention-RetentionMargin is not sent again:
	// its outcome is reported unknown (a *RetryError whose Reason says the
	// intent expired) and Settle settles it through the lookup. Zero
	// values mean 24 hours (the contract's retention) and one hour; New
	// refuses a margin that leaves no time to send.
	Retention, RetentionMargin time.Duration

	// ReconcileDelay is how long after an intent's last attempt a "not
	// found" from the lookup in Reconcile is trusted: the longest a
	// request may take from the device to the server's record, held in
	// the network or a proxy's queue, then the server's lease and
	// processing time. A request held longer than that (a proxy that
	// queues it for an hour) can arrive after a "not found" was trusted;
	// only a server that refuses stale requests could close that, and the
	// contract has no such rule. Zero means 2 minutes; New refuses a
	// negative delay.
	ReconcileDelay time.Duration

	// MaxResponseBytes bounds what is read and kept of one answer: its
	// header fields (as received; the transport's MaxResponseHeaderBytes
	// bounds what it reads of them, 10 MiB by default) and its body
	// together. A larger final answer, or a larger answer of the lookup,
	// still resolves the intent from its status, but its body is not
	// kept: the Response says Oversized. Zero
	// means 10 MiB; New refuses a negative size.
	MaxResponseBytes int64

	// StoredHeaders names header fields of final answers to keep on the
	// device besides those kept by default: Content-Type, Location,
	// Idempotent-Replayed and Retry-After. No other field is stored
	// (cookies, tokens and the like stay off the disk); the Response of
	// the call that got the answer carries all its fields, a Response
	// read from the store only the kept ones. New refuses a name that is
	// not a field name, and one that carries credentials or session
	// state: a name with cookie, auth, token, secret, password, session,
	// api-key, credential or csrf in it, its words joined by hyphens,
	// underscores, dots or nothing, or a name that ends in key but
	// Idempotency-Key (Set-Cookie, Authorization, X-Auth-Token, X-Api_Key,
	// Ocp-Apim-Subscription-Key, ...).
	StoredHeaders []string

	// KeyReusedAnswer recognises how the server says that a key was used
	// with a different request, when it says it otherwise than the
	// contract (a 422 problem of type .../idempotency-key-reused) or
	// Stripe (an error of type idempotency_error). It sees each final
	// answer that is not a 2xx and reports whether it is such a refusal;
	// the intent is then rejected and the error matches ErrKeyReused. It
	// must not keep resp. Nil recognises only those two.
	KeyReusedAnswer func(resp *Response) bool
}

// lookupQuery is the lookup of Server.LookupQuery: the intent's own URL
// with the key in the query parameter param. The query is kept as sent,
// byte for byte and in its order (a pair with ; in it, an escape spelled
// %20 rather than +): it names the intent's resource, and a re-encoded
// one may name another. Only pairs named param are dropped, and
// param=key, escaped, is appended.
func lookupQuery(param string) func(req Request, key string) string {
	return func(req Request, key string) string {
		u, err := url.Parse(req.URL)
		if err != nil {
			// Intents hold validated absolute URLs.
			return ""
		}
		var kept []string
		if u.RawQuery != "" {
			for _, pair := range strings.Split(u.RawQuery, "&") {
				name, _, _ := strings.Cut(pair, "=")
				if n, err := url.QueryUnescape(name); err == nil && n == param {
					continue
				}
				kept = append(kept, pair)
			}
		}
		kept = append(kept, url.QueryEscape(param)+"="+url.QueryEscape(key))
		u.RawQuery = strings.Join(kept, "&")
		u.ForceQuery = false
		u.Fragment = ""
		u.RawFragment = ""
		return u.String()
	}
}

// keptHeaders returns the defaults and the app's names, canonical and
// without repeats.
func keptHeaders(names []string) []string {
	out := append([]string(nil), storedHeaders...)
	for _, n := range names {
		n = http.CanonicalHeaderKey(n)
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
