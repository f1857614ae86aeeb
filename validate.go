package idem

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"time"
)

// refuse records what an Option got wrong; New reports it.
func (c *config) refuse(format string, args ...any) {
	c.invalid = append(c.invalid, fmt.Errorf("idem: "+format, args...))
}

// refuseNil records an Option given nil where it needs a value.
func (c *config) refuseNil(option string, v any, what string) {
	if isNil(v) {
		c.refuse("%s(nil): pass %s, or leave the option out for the default", option, what)
	}
}

// isNil reports a nil interface, or one holding a nil pointer, map, func,
// chan or slice: a value that a method call or a send would panic on.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// validate reports, in one error, everything the options of New got wrong,
// before any default replaces a value.
func (c *config) validate() error {
	errs := append(c.invalid, c.lookupInvalid...)
	if err := c.policy.validate("WithRetryPolicy"); err != nil {
		errs = append(errs, err)
	}
	// Checked as the defaults will make them, with the rest.
	if retention, margin := cmp.Or(c.retention, defaultRetention), cmp.Or(c.margin, defaultSafetyMargin); retention < 0 || margin < 0 || margin >= retention {
		errs = append(errs, fmt.Errorf("idem: WithServer: retention %s with margin %s leaves no time to send: Server.RetentionMargin must be below Server.Retention (0 means 24h and 1h), neither negative", retention, margin))
	}
	if c.reconcile < 0 {
		errs = append(errs, fmt.Errorf("idem: WithServer: Server.ReconcileDelay is %s: use a positive delay, or 0 for the default (%s)", c.reconcile, defaultReconcileDelay))
	}
	if c.maxBody < 0 {
		errs = append(errs, fmt.Errorf("idem: WithServer: Server.MaxResponseBytes is %d: use a positive size, or 0 for the default (%d)", c.maxBody, defaultMaxResponseBytes))
	}
	for _, name := range c.keptHeaders {
		if err := checkStoredHeader(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// validate reports the fields of p that are out of range; option names
// where p came from (WithRetryPolicy or ContextWithRetryPolicy).
func (p RetryPolicy) validate(option string) error {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("idem: %s: RetryPolicy.%s is %v: %s", option, field, v, want))
	}
	if p.MaxAttempts < 0 {
		bad("MaxAttempts", p.MaxAttempts, "use 1 or more, or 0 for the default (10)")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
		def   string
	}{
		{"MaxElapsed", p.MaxElapsed, "2m"},
		{"InitialInterval", p.InitialInterval, "500ms"},
		{"MaxInterval", p.MaxInterval, "30s"},
		{"MaxRetryAfter", p.MaxRetryAfter, "60s"},
	} {
		if d.v < 0 {
			bad(d.field, d.v, "use a positive duration, or 0 for the default ("+d.def+")")
		}
	}
	if p.InitialInterval > 0 && p.MaxInterval > 0 && p.MaxInterval < p.InitialInterval {
		bad("MaxInterval", p.MaxInterval, fmt.Sprintf("it is below InitialInterval (%s): raise MaxInterval or lower InitialInterval", p.InitialInterval))
	}
	if m := p.Multiplier; m != 0 && (math.IsNaN(m) || math.IsInf(m, 0) || m < 1) {
		bad("Multiplier", m, "use 1 (the same wait each time) or more, or 0 for the default (2)")
	}
	if j := p.Jitter; j != 0 && j != -1 && (math.IsNaN(j) || j < 0 || j > 1) {
		bad("Jitter", j, "use a fraction above 0 and at most 1, 0 for the default (0.5), or -1 for none")
	}
	return errors.Join(errs...)
}

// checkPolicy reports a policy given by ContextWithRetryPolicy that is out
// of range: the call it would govern is refused before anything is armed
// or sent, rather than run under defaults the app did not ask for.
func checkPolicy(ctx interface{ Value(any) any }) error {
	p, ok := ctx.Value(policyKey{}).(RetryPolicy)
	if !ok {
		return nil
	}
	return p.validate("ContextWithRetryPolicy")
}

// credentialHeaders are header fields that carry credentials or session
// state, which Server.StoredHeaders may not name to keep on the device: the
// words are matched anywhere in the lower-case name with its hyphens,
// underscores and dots left out, so X-Api_Key and api.key are refused as
// X-Api-Key is.
var credentialHeaders = []string{"cookie", "auth", "token", "secret", "password", "passwd", "session", "apikey", "credential", "csrf", "xsrf",
	"jwt", "oidc", "saml", "assertion", "bearer", "accesskey", "privatekey"}

// checkStoredHeader refuses a name Server.StoredHeaders may not hold: one
// that is not a header field name, or one that carries credentials.
func checkStoredHeader(name string) error {
	if !validFieldName(name) {
		return fmt.Errorf("idem: WithServer: Server.StoredHeaders holds %q: not a header field name", name)
	}
	if w := credentialWord(name); w != "" {
		return fmt.Errorf("idem: WithServer: Server.StoredHeaders holds %q: the field carries credentials or session state (%q), which are never written to the device; keep what the app needs of it in memory", http.CanonicalHeaderKey(name), w)
	}
	return nil
}

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

// checkLookupQuery refuses a Server.LookupQuery that is not a query
// parameter's name: a query written out ("idempotency_key=", "?k"), or a
// name with a space or a control character in it, which no lookup of the
// server would find.
func checkLookupQuery(name string) error {
	for _, r := range name {
		if r <= ' ' || r == 0x7f || strings.ContainsRune("=&?#", r) {
			return fmt.Errorf("idem: WithServer: Server.LookupQuery is %q: give the name of the query parameter alone, such as \"idempotency_key\"", name)
		}
	}
	return nil
}

// validFieldName reports a header field name: a non-empty RFC 9110 token.
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		switch {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0:
		default:
			return false
		}
	}
	return true
}
