package idem

import (
	"bytes"
	"encoding/json"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/idemkit/idem/persist"
)

// Whose word an answer is.
//
// Anything on the path between the device and the server can answer a
// request. A CDN sends a 404 page or a single-page-app fallback. An API
// gateway sends a 401, a WAF a 403 and a proxy a 407. A captive portal sends
// a 200 login page. Only the server's record of the key can say what became
// of the intent. So idem settles an intent only on an answer that shows it
// is the server's. Such an answer does one of these:
//
//   - It carries the intent's key back in an Idempotency-Key header field.
//     The key may be bare or an RFC 8941 sf-string. The contract's servers
//     and Stripe echo it so.
//   - The server's declared Mark (Server.Mark) recognises it. That is a body
//     only the server sends (MarkIncrease, MarkJSONID). Or it is the app's
//     own test (MarkRecognizer).
//
// Idempotent-Replayed: true alone is not the mark. A cache may serve another
// intent's replay.
//
// An answer without the mark is a stranger's as far as idem can tell. A
// gateway that copies request header fields into its own answers could forge
// the echo. So the attempts of a send carry a random nonce
// (attemptNonceHeader). No server sends it back, so an answer that carries
// it is such a copy. The lookup's "nothing was done" is believed only from
// its typed miss (problemKeyUnused). The echo alone never proves it.

// retryableStatus reports an answer that does not settle the intent. The
// server may or may not have done the work, or not done it yet. The same key
// may be sent again. These statuses are 408, 409 (in progress), 429 and
// every 5xx. A proxy's 520-524 counts as much as the origin's 500. A 5xx
// says nothing about whether the work was done. Every status outside 100-599
// counts too, for no server states its meaning. An answer the server marked
// as its stored record is final whatever its status. (See replayed.)
func retryableStatus(code int) bool {
	switch {
	case code < 100 || code > 599, code >= 500:
		return true
	}
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return true
	}
	return false
}

// replayed reports an answer marked Idempotent-Replayed: true. That is the
// server's stored record for the key. It is final whatever its status, for
// sending the key again only replays it.
func replayed(h http.Header) bool {
	return strings.EqualFold(strings.TrimSpace(h.Get("Idempotent-Replayed")), "true")
}

// isFinal reports whether an answer with this status and headers is final.
// It judges the answer for the intent whose key is key. A redirect is final
// only when it is the server's word that the work was done (seeOther). Any
// other redirect that reaches the client is not final. (See
// unfollowedRedirect.)
func isFinal(code int, h http.Header, key string) bool {
	if unfollowedRedirect(code) {
		return seeOther(code, h, key)
	}
	return replayed(h) || !retryableStatus(code)
}

// isSuccess reports a 2xx status.
func isSuccess(status int) bool { return status >= 200 && status < 300 }

// done reports a final answer that says the work was done. That is a 2xx, or
// a 303 the server marked (see seeOther).
func done(status int) bool { return isSuccess(status) || status == http.StatusSeeOther }

// marked reports an answer the server marked as its own for key. The mark is
// the key's echo. The replay header alone is not the mark. A cache on the
// path may keep another intent's replay. It then serves it to every POST of
// the URL. And a replay that echoes no key names no intent. Such a replay is
// the server's word only when the declared Mark recognises it. (For
// MarkIncrease, its body's idempotency_key is the key.)
func marked(h http.Header, key string) bool {
	return echoes(h, key)
}

// unfollowedRedirect reports a 3xx that reached the client. redirectPolicy
// did not follow it, or net/http could not. redirectPolicy does not follow
// 301, 302, 303 after a POST, and 307 or 308 from https to http. net/http
// cannot follow 300, 304, or one without a Location.
func unfollowedRedirect(code int) bool { return code >= 300 && code < 400 }

// seeOther reports the one redirect that is an outcome. That is a 303 the
// server marked as its word on key (see marked). Asking again would get its
// replay. The work is done, and Location names the result.
func seeOther(code int, h http.Header, key string) bool {
	return code == http.StatusSeeOther && marked(h, key)
}

// answered says rec records the server's answer to the intent. That is the
// send's final answer, or the lookup's word that the work was done. It is the
// truth about the key, whoever holds the record. A void is not. It is trusted
// only while no attempt can still arrive, and another holder may be sending
// one.
func answered(rec *persist.Record) bool {
	return rec.State.Resolved() && rec.Response != nil
}

// answerRules is how a Client reads its server's answers. It says which
// answers are the server's word and which say the key was reused. It says
// what of an answer the device keeps. The config embeds it.
type answerRules struct {
	maxBody int64 // bytes read of one answer, header fields included
	// keyReusedAnswer recognises the app's own server's key reuse answers.
	keyReusedAnswer func(*Response) bool
	// ownAnswer recognises the server's answers that lack the contract's
	// marks. It judges them for the intent with the key it is given
	// (Server.Mark). Nil trusts the contract's marks alone.
	ownAnswer func(resp *Response, key string) bool
	// ownNamesKey says that ownAnswer recognises only an answer that names
	// the key (Mark.namesKey).
	ownNamesKey bool
	// keptHeaders are the canonical names of the answer's header fields kept
	// on the device.
	keptHeaders []string
}

// trusted reports an answer that is the server's word on key. It is marked,
// or the server's declared Mark recognises it. body is nil when it was not
// kept, being over the limit.
func (c *answerRules) trusted(status int, h http.Header, body []byte, key string) bool {
	if marked(h, key) {
		return true
	}
	return c.ownAnswer != nil && c.ownAnswer(&Response{StatusCode: status, Header: h.Clone(), Body: bytes.Clone(body)}, key)
}

// trustedAnswer reports a send's final answer that is the server's word on
// key. An answer may come from another origin than the attempt's request.
// (net/http followed a 307 or 308 to another host.) Such an answer is the
// server's word only by the key's echo. A recognizer reads a body, and a
// stranger's JSON looks like the server's. Say a captive portal redirects
// the POST to its own API. That API answers {"id": "sess_..."}.
func (c *answerRules) trustedAnswer(resp *http.Response, body []byte, key string) bool {
	if reflected(resp.Header) {
		return false
	}
	if fromAnotherOrigin(resp) {
		return echoes(resp.Header, key)
	}
	if !c.trusted(resp.StatusCode, resp.Header, body, key) {
		return false
	}
	// A recognizer that reads no key cannot tell this intent's answer from
	// another's. A cache may have kept another's answer (Age above 0) and
	// served it to this POST.
	return c.ownNamesKey || echoes(resp.Header, key) || !cacheServed(resp.Header)
}

// cacheServed reports an answer a cache kept before serving it. Its Age is
// above 0. A cache that passes an answer through may say Age: 0.
func cacheServed(h http.Header) bool {
	age := h.Get("Age")
	return age != "" && strings.TrimLeft(age, "0") != ""
}

// attemptNonceHeader is the request header field of a send's nonce. The
// attempts of a send carry a random nonce in it, one per call. No server
// sends it back (docs/CONTRACT.md). So an answer that carries it is a
// reflection. A gateway or a mock copied the request's header fields into
// its answer. The Idempotency-Key was among them, so the key's echo is
// forged.
const attemptNonceHeader = "Idempotency-Attempt-Nonce"

// reflected reports an answer that carries the attempt's nonce back. It is
// never the server's word, whatever else it carries.
func reflected(h http.Header) bool { return len(h.Values(attemptNonceHeader)) > 0 }

// fromAnotherOrigin reports an answer from another origin than its chain's
// start. An origin is a scheme, host and port. The chain's start is the
// first request of its chain of redirects. net/http links each redirected
// request to the answer that caused it (Request.Response). So the chain
// leads back to the first request.
func fromAnotherOrigin(resp *http.Response) bool {
	if resp == nil || resp.Request == nil || resp.Request.URL == nil {
		return false
	}
	first := resp.Request
	for first.Response != nil && first.Response.Request != nil {
		first = first.Response.Request
	}
	if first == resp.Request {
		// No redirect was followed, so this is the request's own origin.
		return false
	}
	return first.URL == nil || origin(first.URL) != origin(resp.Request.URL)
}

// origin returns u's scheme, host and port in lower case. The port is made
// explicit.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// problemKeyUnused is the problem type of the lookup's miss. It says nothing
// was done under the key, and nothing under it is in progress. It is the
// contract's (docs/CONTRACT.md, key-unused). It is spelled here so that the
// client does not import the server half.
const problemKeyUnused = "https://idem.dev/problems/idempotency-key-unused"

// isKeyUnused reports the lookup's typed miss. That is a 404 problem of type
// problemKeyUnused.
func isKeyUnused(status int, h http.Header, body []byte) bool {
	return status == http.StatusNotFound && parseProblem(h, body).Type == problemKeyUnused
}

// stateFor classifies a final answer.
func (c *answerRules) stateFor(status int, header http.Header, body []byte) persist.State {
	switch {
	case done(status):
		return persist.StateSucceeded
	case c.keyReused(status, header, body),
		isKeyProblem(status, parseProblem(header, body).Type):
		return persist.StateRejected
	}
	return persist.StateFailed
}

// keyReused reports a final answer that says the key was used with another
// request. (See ErrKeyReused.)
func (c *answerRules) keyReused(status int, header http.Header, body []byte) bool {
	if done(status) {
		return false
	}
	if isKeyReused(status, header, body) {
		return true
	}
	return c.keyReusedAnswer != nil && c.keyReusedAnswer(&Response{StatusCode: status, Header: header.Clone(), Body: bytes.Clone(body)})
}

// isKeyReused reports an answer that says the key was used with another
// request. It judges by what the answer says. The contract says it with its
// problem type on a 422. Stripe says it with a JSON error of type
// idempotency_error, sent with 400. A 422 without either is an ordinary
// final answer. Many APIs use 422 for plain validation.
func isKeyReused(status int, header http.Header, body []byte) bool {
	switch status {
	case http.StatusUnprocessableEntity:
		if problemName(parseProblem(header, body).Type) == "idempotency-key-reused" {
			return true
		}
		fallthrough
	case http.StatusBadRequest:
		return isStripeIdempotencyError(header, body)
	}
	return false
}

// isKeyProblem reports a 400 about the Idempotency-Key itself. The contract
// names these problem types. A server that sends no problem type gives no
// way to tell. Its 400 is treated as an ordinary final answer.
func isKeyProblem(status int, typ string) bool {
	if status != http.StatusBadRequest {
		return false
	}
	switch problemName(typ) {
	case "idempotency-key-missing", "idempotency-key-invalid":
		return true
	}
	return false
}

// problemName is the last path segment of a problem type URI. That segment
// names the problem ("idempotency-key-reused").
func problemName(typ string) string {
	typ = strings.TrimRight(typ, "/")
	if i := strings.LastIndexByte(typ, '/'); i >= 0 {
		return typ[i+1:]
	}
	return typ
}

// isStripeIdempotencyError reports Stripe's error body {"error": {"type":
// "idempotency_error", ...}}.
func isStripeIdempotencyError(header http.Header, body []byte) bool {
	ct, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if ct != "application/json" {
		return false
	}
	var e struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &e) == nil && e.Error.Type == "idempotency_error"
}

// problem is an RFC 9457 problem document, as APIError.Problem holds it.
type problem = struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// parseProblem decodes an RFC 9457 body. Anything else yields the zero
// problem. It never fails, so a server that answers nonsense still gets its
// status reported.
func parseProblem(header http.Header, body []byte) problem {
	ct, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if ct != "application/problem+json" && ct != "application/json" {
		return problem{}
	}
	var p problem
	if json.Unmarshal(body, &p) != nil {
		return problem{}
	}
	return p
}

// stored returns what the device keeps of a final answer. That is its
// status, the header fields a replay and the app need, and its body.
func (c *answerRules) stored(resp *Response) *persist.Response {
	return c.storedIn(new(persist.Response), resp)
}

// storedIn is stored, made in r. That lets it share the allocation of the
// record's version.
func (c *answerRules) storedIn(r *persist.Response, resp *Response) *persist.Response {
	*r = persist.Response{
		StatusCode: resp.StatusCode,
		Header:     c.storedHeader(resp.Header),
		Body:       bytes.Clone(resp.Body),
		Replayed:   resp.Replayed,
		Oversized:  resp.Oversized,
	}
	return r
}

// storedHeader returns the header fields of h that are kept on the device.
// They are those of storedHeaders, then those the app named
// (Server.StoredHeaders). They are kept while they fit the Client's limit on
// an answer. Nothing else is written to the device: no cookies, tokens or
// tracing.
func (c *answerRules) storedHeader(h http.Header) http.Header {
	var (
		out  http.Header
		size int64
		vals []string // one array for every kept value, as Header.Clone does
	)
	for _, name := range c.keptHeaders {
		vs := h[name]
		if len(vs) == 0 {
			continue
		}
		n := fieldBytes(name, vs)
		if size+n > c.maxBody {
			continue
		}
		size += n
		if out == nil {
			out = make(http.Header, len(c.keptHeaders))
			vals = make([]string, 0, c.keptValues(h))
		}
		vals = append(vals, vs...)
		// Capped, so that an append to one field's values copies them.
		out[name] = vals[len(vals)-len(vs) : len(vals) : len(vals)]
	}
	return out
}

// keptValues returns how many values of h storedHeader may keep.
func (c *answerRules) keptValues(h http.Header) int {
	n := 0
	for _, name := range c.keptHeaders {
		n += len(h[name])
	}
	return n
}

// keptHeaders returns the defaults and the app's names. They are canonical
// and without repeats.
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
