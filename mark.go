package idem

import (
	"bytes"
	"net/http"

	"github.com/dunglas/httpsfv"
)

// problemKeyUnused is the problem type of the lookup's miss: nothing was
// done under the key, and nothing under it is in progress. It is the
// contract's (the idempotency package's TypeKeyUnused), spelled here so
// that the client does not import the server half.
const problemKeyUnused = "https://idem.dev/problems/idempotency-key-unused"

// Whose word an answer is.
//
// Anything on the path between the device and the server can answer a
// request: a CDN's 404 page or single-page-app fallback, an API gateway's
// 401, a WAF's 403, a proxy's 407, a captive portal's 200 login page. Only
// the server's record of the key can say what became of the intent, so
// idem settles an intent only on an answer that shows it is the server's:
//
//   - it carries the intent's key back in an Idempotency-Key header field
//     (bare or as an RFC 8941 sf-string, as the contract's servers and
//     Stripe echo it), or is marked Idempotent-Replayed: true;
//   - or the app's recognizer (WithServerAnswer) says it is its server's.
//
// An answer without the mark is a stranger's as far as idem can tell. A
// gateway that copies request header fields into its own answers could
// forge the echo; that is why the lookup's "nothing was done" is believed
// only from its typed miss (problemKeyUnused), never from the echo alone.

// echoes reports whether h carries key back in its Idempotency-Key field,
// bare or quoted. Any one field line that names the key is enough; one
// that names another key is not the server's answer to this intent. key
// may itself be spelled quoted (the key an app's own API client put on a
// request through the RoundTripper): the two are compared as the server
// reads them.
func echoes(h http.Header, key string) bool {
	want := echoKey(key)
	if want == "" {
		return false
	}
	for _, v := range h.Values("Idempotency-Key") {
		if echoKey(v) == want {
			return true
		}
	}
	return false
}

// echoKey reads the key of one echoed value: the sf-string's content when
// quoted, the value itself otherwise (as the server parses the request's).
func echoKey(v string) string {
	if len(v) > 0 && v[0] == '"' {
		item, err := httpsfv.UnmarshalItem([]string{v})
		if err != nil {
			return ""
		}
		s, _ := item.Value.(string)
		return s
	}
	return v
}

// marked reports an answer the server marked as its own for key: the echo
// or the replay header.
func marked(h http.Header, key string) bool { return replayed(h) || echoes(h, key) }

// trusted reports an answer that is the server's word on key: marked, or
// recognised by the app's WithServerAnswer. body is nil when it was not
// kept (over the limit).
func (c *Client) trusted(status int, h http.Header, body []byte, key string) bool {
	if marked(h, key) {
		return true
	}
	return c.isServerAnswer != nil && c.isServerAnswer(&Response{StatusCode: status, Header: h.Clone(), Body: bytes.Clone(body)})
}

// isSuccess reports a 2xx status.
func isSuccess(status int) bool { return status >= 200 && status < 300 }

// isKeyUnused reports the lookup's typed miss: a 404 problem of type
// problemKeyUnused.
func isKeyUnused(status int, h http.Header, body []byte) bool {
	return status == http.StatusNotFound && parseProblem(h, body).Type == problemKeyUnused
}
