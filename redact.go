package idem

import (
	"net/url"
	"strings"
)

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

// credentialHeaders are header fields that carry credentials or session
// state, which Server.StoredHeaders may not name to keep on the device: the
// words are matched anywhere in the lower-case name with its hyphens,
// underscores and dots left out, so X-Api_Key and api.key are refused as
// X-Api-Key is.
var credentialHeaders = []string{"cookie", "auth", "token", "secret", "password", "passwd", "session", "apikey", "credential", "csrf", "xsrf",
	"jwt", "oidc", "saml", "assertion", "bearer", "accesskey", "privatekey"}

// credentialWord returns the word of credentialHeaders that name holds,
// in any case and with its hyphens, underscores and dots left out, or
// "key" for a name that ends in it (but Idempotency-Key), or "".
func credentialWord(name string) string {
	joined := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' {
			return -1
		}
		return r
	}, strings.ToLower(name))
	for _, w := range credentialHeaders {
		if strings.Contains(joined, w) {
			return w
		}
	}
	// A key a server gives or takes by name (Ocp-Apim-Subscription-Key,
	// X-Functions-Key, X-Client-Key), but not the idempotency key.
	if strings.HasSuffix(joined, "key") && joined != "idempotencykey" {
		return "key"
	}
	return ""
}
