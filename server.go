package idem

import (
	"net/url"
	"strings"
	"time"
)

// Server describes the app's server to a Client. It says how to ask the
// server what became of a key. It says how the server spells and keeps keys,
// and what its answers look like. It is Config.Server. Mark is required, and
// New refuses a Server without one. Every other field left zero keeps the
// default its comment gives. A Server with only its Mark follows the
// contract (docs/CONTRACT.md). It has no lookup.
type Server struct {
	// Mark says how the server marks its answers as its own. It is one of
	// these:
	//
	//   - A preset: MarkEcho, MarkStripe, MarkAdyen or MarkIncrease.
	//   - MarkJSONID, for a plain server whose answers carry the resource's
	//     id.
	//   - A MarkRecognizer.
	//
	// MarkEcho is for idem's middleware and servers that follow the
	// contract.
	//
	// An answer without the mark could come from a box in front of the
	// server. A CDN, a gateway or a captive portal could send it. idem never
	// lets such an answer settle an intent. (See the package documentation,
	// "Whose word settles an intent".) New refuses a Server without a Mark.
	// So a server that marks nothing is found at setup, not at the first
	// payment.
	Mark Mark

	// Lookup returns the URL of a GET that asks the server about key. That
	// GET learns what became of the key without sending the intent again.
	// The server answers 2xx with the effect made under key, or 404 for
	// none. Reconcile and Settle use it. It is the one place an app builds
	// that URL. Without a lookup (Lookup nil and LookupQuery empty), an
	// intent too old to send again cannot be settled.
	Lookup func(req Request, key string) string
	// LookupQuery is the lookup of a server that finds a key's effect at the
	// intent's own URL. The key goes in the query parameter LookupQuery
	// names, as the contract does. Say an intent POSTs to
	// https://api.example/payments. Then LookupQuery "idempotency_key" asks
	// this:
	//
	//	GET https://api.example/payments?idempotency_key=K
	//
	// The intent's query is kept as sent, in its order and spelling. The key
	// parameter is appended to it. A parameter of that name already in the
	// intent's URL is replaced. New refuses a Server with both Lookup and
	// LookupQuery. It refuses a LookupQuery that is not a parameter's name.
	// Such a name holds a space, a control character, =, &, ? or #.
	LookupQuery string

	// QuotedKey sends the key as an RFC 8941 sf-string ("..."), as the IETF
	// draft writes it. False sends the bare value that deployed APIs expect.
	QuotedKey bool

	// Retention is how long the server keeps idempotency records.
	// RetentionMargin is how long before that the client stops sending a
	// key. An intent older than Retention-RetentionMargin is not sent again.
	// Its outcome is reported unknown, as a *RetryError. The error's Reason
	// says the intent expired. Settle then settles it through the lookup.
	// Zero values mean 24 hours (the contract's retention) and one hour. New
	// refuses a margin that leaves no time to send.
	Retention, RetentionMargin time.Duration

	// ReconcileDelay is how long after an intent's last attempt Reconcile
	// trusts a "not found" from the lookup. It is the longest a request may
	// take to reach the server's record. That time counts the network and
	// any proxy's queue. It counts the server's lease and processing time
	// too. A request held longer than that can arrive after a "not found"
	// was trusted. (Think of a proxy that queues it for an hour.) Only a
	// server that refuses stale requests could close that gap. The contract
	// has no such rule. Zero means 2 minutes, and New refuses a negative
	// delay.
	ReconcileDelay time.Duration

	// MaxResponseBytes bounds what is read and kept of one answer. It counts
	// the answer's header fields, as received, and its body together. (The
	// transport's MaxResponseHeaderBytes bounds what it reads of the fields.
	// It is 10 MiB by default.) A larger final answer still resolves the
	// intent from its status. So does a larger answer of the lookup. But its
	// body is not kept, and the Response says Oversized. Zero means 10 MiB,
	// and New refuses a negative size.
	MaxResponseBytes int64

	// StoredHeaders names more header fields of final answers to keep on the
	// device. These fields are kept by default: Content-Type, Location,
	// Idempotent-Replayed and Retry-After. No other field is stored, so
	// cookies, tokens and the like stay off the disk. The Response of the
	// call that got the answer carries all its fields. A Response read from
	// the store carries only the kept ones.
	//
	// New refuses a name that is not a field name. It refuses a name that
	// carries credentials or session state too. Such a name holds one of
	// these words:
	//
	//	cookie auth token secret password session api-key credential csrf
	//
	// The words may be joined by hyphens, underscores, dots or nothing. A
	// name that ends in key is refused too, but for Idempotency-Key. So New
	// refuses Set-Cookie, Authorization, X-Auth-Token and X-Api_Key. It
	// refuses Ocp-Apim-Subscription-Key too.
	StoredHeaders []string

	// KeyReusedAnswer recognises how the server says a key was used with a
	// different request. It is for a server that says so its own way. The
	// contract says it with a 422 problem of type
	// .../idempotency-key-reused. Stripe says it with an error of type
	// idempotency_error. KeyReusedAnswer sees each final answer that is not
	// a 2xx. It reports whether that answer is such a refusal. The intent is
	// then rejected, and the error matches ErrKeyReused. It must not keep
	// resp. Nil recognises only the two ways above.
	KeyReusedAnswer func(resp *Response) bool
}

// lookupQuery is the lookup of Server.LookupQuery. It is the intent's own
// URL with the key in the query parameter param. The query is kept as sent,
// byte for byte and in its order. (A pair may hold ;, and an escape may be
// %20 rather than +.) The query names the intent's resource, and a
// re-encoded one may name another. Only pairs named param are dropped. Then
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
