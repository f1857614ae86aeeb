package idem

import (
	"net/url"
	"strings"
)

// redactURL returns raw as the attempt hook may show it. It holds no
// credential, nor anything a server never sees. A password is replaced, as
// url.URL.Redacted does. So is a user name without a password, or with an
// empty one. Such a user name may be a token or a secret key. (For example:
// "https://sk_live_...:@api.example".) So is the value of every query
// parameter whose name speaks of a credential. (Examples are access_token,
// api_key and X-Amz-Signature. See credentialQuery.) A fragment is dropped.
// It returns raw itself if it does not parse, and no request is then made.
func redactURL(raw string) string { return redactUserinfo(raw, false) }

// redactErr returns a copy of err whose URL is redacted. That is the URL
// net/http's *url.Error names. The user name is always redacted. (net/http
// has starred only a password, an empty one included.) The copy is the same
// error to errors.Is and errors.As. Its text carries no credential.
func redactErr(err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	redacted := *ue
	redacted.URL = redactUserinfo(ue.URL, true)
	return &redacted
}

// redactUserinfo is redactURL. It redacts the user name too when anyUser is
// set.
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
// credential. It holds a word of credentialHeaders however it is joined.
// (pass_word counts as password; see credentialWord.) Or it holds a key or a
// signature anywhere in it.
func credentialQuery(name string) bool {
	lower := strings.ToLower(name)
	return credentialWord(name) != "" || strings.Contains(lower, "key") || strings.Contains(lower, "sig")
}

// credentialHeaders are header fields that carry credentials or session
// state. Server.StoredHeaders may not name them to keep on the device. The
// words are matched anywhere in the lower-case name. The name's hyphens,
// underscores and dots are left out. So X-Api_Key and api.key are refused as
// X-Api-Key is.
var credentialHeaders = []string{"cookie", "auth", "token", "secret", "password", "passwd", "session", "apikey", "credential", "csrf", "xsrf",
	"jwt", "oidc", "saml", "assertion", "bearer", "accesskey", "privatekey"}

// credentialWord returns the word of credentialHeaders that name holds. Case
// does not matter, and hyphens, underscores and dots are left out. For a
// name that ends in "key", it returns "key". (Idempotency-Key is the one
// exception.) Otherwise it returns "".
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
	// A key a server gives or takes by name, but not the idempotency key.
	// (Examples are Ocp-Apim-Subscription-Key, X-Functions-Key and
	// X-Client-Key.)
	if strings.HasSuffix(joined, "key") && joined != "idempotencykey" {
		return "key"
	}
	return ""
}
