package idem

import (
	"net/url"
	"strings"
)

// attemptDone tells the attempt hook (and the app's logger, through
// config.attemptDone) of the call's current attempt, adding what the call
// knows of it: the intent's name and URL, and how long the attempt took on
// the Client's clock.
func (st *call) attemptDone(a Attempt) {
	if st.cfg.onAttempt == nil && st.cfg.logger == nil {
		return
	}
	if !st.urlRedacted {
		st.url, st.urlRedacted = redactURL(st.url), true
	}
	a.Name, a.URL, a.Err = st.name, st.url, redactErr(a.Err)
	if !st.began.IsZero() {
		a.Duration = max(0, st.cfg.clock.Now().Sub(st.began))
	}
	st.cfg.attemptDone(a)
}

// redactURL returns raw as the attempt hook may show it: with no
// credential in it, nor anything a server never sees. A password is
// replaced, as url.URL.Redacted does; so is a user name without a password
// or with an empty one (a token, or a secret key sent as the user name:
// "https://sk_live_...:@api.example"), and the value of every query
// parameter whose name speaks of a credential (access_token, api_key,
// X-Amz-Signature: see credentialQuery). A fragment is dropped. It returns
// raw itself if it does not parse (no request is then made).
func redactURL(raw string) string { return redactUserinfo(raw, false) }

// redactErr returns err with the URL that net/http's *url.Error names
// redacted, the user name always (net/http has starred only a password,
// an empty one included), as a copy: the same error to errors.Is and
// errors.As, whose text carries no credential.
func redactErr(err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	redacted := *ue
	redacted.URL = redactUserinfo(ue.URL, true)
	return &redacted
}

// redactUserinfo is redactURL, which redacts the user name too when
// anyUser is set.
func redactUserinfo(raw string, anyUser bool) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	if u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" && !anyUser {
			u.User = url.UserPassword(u.User.Username(), redacted)
		} else {
			u.User = url.User(redacted)
		}
	}
	u.Fragment, u.RawFragment = "", ""
	if u.RawQuery != "" {
		parts := strings.Split(u.RawQuery, "&")
		for i, part := range parts {
			name, _, _ := strings.Cut(part, "=")
			if unescaped, err := url.QueryUnescape(name); err == nil && credentialQuery(unescaped) {
				parts[i] = name + "=" + redacted
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	return u.String()
}

// redacted stands for what redactURL hides, as in url.URL.Redacted.
const redacted = "xxxxx"

// credentialQuery reports a query parameter name that speaks of a
// credential: a word of credentialHeaders however it is joined (pass_word
// as password, see credentialWord), or of a key or a signature anywhere in
// it.
func credentialQuery(name string) bool {
	lower := strings.ToLower(name)
	return credentialWord(name) != "" || strings.Contains(lower, "key") || strings.Contains(lower, "sig")
}
