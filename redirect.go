package idem

import (
	"net/http"
	"net/url"
)

// What a redirect answer to a POST or PATCH means.
//
//   - A 303 See Other marked as the server's (its key echoed) is the
//     server's word that the work was done. Its Location names the result.
//     It is the intent's final answer, a success, fresh or replayed. A retry
//     after a lost first answer gets the replayed 303 and ends paid.
//   - 307 and 308 are followed by redirectPolicy, with the intent's stored
//     bytes. One that reaches the client (from https to http) is not
//     followed. It is no outcome.
//   - 301, 302, an unmarked 303, and any other 3xx are no outcome, marked or
//     not. (Other 3xx are 300, 304, and one without a Location.) A login
//     page or a CDN sends them as readily as a server. The call ends at once
//     with the outcome unknown. The intent is reconciled through the lookup.
//
// No redirect is ever "failed", for none says the work was not done.

// redirectPolicy returns a copy of hc that follows only some redirects. It
// follows only those that keep the request as it is. So the answer to a
// redirect is never taken for the intent's outcome.
//
//   - 307 and 308 are followed as net/http does, up to 10 in a row. The
//     method, headers and body stay the same. (The key is spelled as
//     stored.) A longer chain ends with errRedirectLoop. A Location whose
//     scheme is not http or https ends with an error. Neither reached a
//     server that does the work.
//   - A 307 or 308 from https to http is not followed either. The intent's
//     body and headers would leave TLS. So would its credentials, where the
//     app's transport adds them. The call ends with the outcome unknown, as
//     for the redirects below.
//   - 301, 302 and 303 would turn a POST or PATCH into a GET. Its answer (a
//     login page, say) says nothing about the intent. They are not followed.
//     They end the call with the outcome unknown (see unfollowedRedirect).
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

// otherURL reports a redirect to a URL the server may take for another
// request. The server's fingerprint of a request covers the path and the
// query. So under the same key, another URL may be another request.
// Spellings are compared as sent. So a path or query spelled another way
// counts as another URL. That is the safe side. The outcome is then asked of
// the lookup, not taken as "not paid".
func otherURL(to, from *url.URL) bool {
	return to.EscapedPath() != from.EscapedPath() || to.RawQuery != from.RawQuery
}
