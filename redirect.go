package idem

import (
	"net/http"
	"net/url"
)

// What a redirect answer to a POST or PATCH means.
//
//   - A 303 See Other marked as the server's (its key echoed) is the
//     server's word that the work was done: its Location names the result. It is the intent's final answer, a
//     success, fresh or replayed; a retry after a lost first answer gets
//     the replayed 303 and ends paid.
//   - 307 and 308 are followed, with the intent's stored bytes, by
//     redirectPolicy. One that reaches the client (from https to http)
//     is not followed and is no outcome.
//   - 301, 302, an unmarked 303, and any other 3xx (300, 304, one
//     without a Location) are no outcome, marked or not: a login page or
//     a CDN sends them as readily as a server. The call ends at once, the
//     outcome unknown, and the intent is reconciled through the lookup.
//
// No redirect is ever "failed": none says the work was not done.

// unfollowedRedirect reports a 3xx that reached the client: one that
// redirectPolicy did not follow (301, 302, 303 after a POST, a 307 or 308
// from https to http) or that net/http could not (no Location, 300, 304).
func unfollowedRedirect(code int) bool { return code >= 300 && code < 400 }

// seeOther reports the one redirect that is an outcome: a 303 the server
// marked as its word on key (see marked). Asking again would get its
// replay: the work is done, and Location names the result.
func seeOther(code int, h http.Header, key string) bool {
	return code == http.StatusSeeOther && marked(h, key)
}

// redirectPolicy returns a copy of hc that follows only the redirects that
// keep the request as it is, so that the answer to a redirect is never
// taken for the intent's outcome:
//
//   - 307 and 308 are followed with the same method, headers (the key
//     spelled as stored) and body, as net/http does, up to 10 in a row;
//     a longer chain ends with errRedirectLoop, and a Location whose
//     scheme is not http or https with an error: neither reached a server
//     that does the work.
//   - A 307 or 308 from https to http is not followed either: the
//     intent's body and headers (its credentials too, where the app's
//     transport adds them) would leave TLS. The call ends with the outcome
//     unknown, as for the redirects below.
//   - 301, 302 and 303 would turn a POST or PATCH into a GET, whose answer
//     (a login page, say) says nothing about the intent. They are not
//     followed, and end the call with the outcome unknown (see
//     unfollowedRedirect).
//
// hc's own CheckRedirect, if any, still decides on the redirects that are
// followed.
func redirectPolicy(hc *http.Client) *http.Client {
	cp := *hc
	check := hc.CheckRedirect
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.Method != via[0].Method || via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme == "http" {
			return http.ErrUseLastResponse
		}
		if s := req.URL.Scheme; s != "http" && s != "https" {
			return &redirectSchemeError{location: req.URL.Redacted()}
		}
		if check != nil {
			if err := check(req, via); err != nil {
				return err
			}
		} else if len(via) >= 10 { // net/http's default
			return errRedirectLoop
		}
		if st, ok := callIn(req.Context()); ok && otherURL(req.URL, via[0].URL) {
			st.redirectedAway()
		}
		return nil
	}
	return &cp
}

// otherURL reports a redirect to a URL whose request the server may take
// for another request under the same key: its fingerprint covers the path
// and the query. Spellings are compared as sent, so a path or query spelled
// another way counts as another URL (the safe side: the outcome is then
// asked of the lookup rather than taken as "not paid").
func otherURL(to, from *url.URL) bool {
	return to.EscapedPath() != from.EscapedPath() || to.RawQuery != from.RawQuery
}
