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

// validate reports, in one error, every field of cfg out of range, before
// any default replaces a value.
func (cfg Config) validate() error {
	var errs []error
	refuse := func(format string, args ...any) { errs = append(errs, fmt.Errorf("idem: "+format, args...)) }
	// A nil pointer in an interface (a store from an OpenDir whose error
	// was dropped) is not "none": it would panic at the first call.
	if cfg.Store != nil && isNil(cfg.Store) {
		refuse("Config.Store is a nil %T: pass the store persist.OpenDir returned with a nil error, or leave Store nil for a memory store", cfg.Store)
	}
	if cfg.Clock != nil && isNil(cfg.Clock) {
		refuse("Config.Clock is a nil %T: pass a clock (clock.NewManual in tests), or leave Clock nil for the system clock", cfg.Clock)
	}
	if err := cfg.RetryPolicy.validate("Config.RetryPolicy"); err != nil {
		errs = append(errs, err)
	}
	if err := cfg.RetryBudget.validate(); err != nil {
		errs = append(errs, err)
	}
	if n := cfg.SettleConcurrency; n < 0 {
		refuse("Config.SettleConcurrency is %d: use 1 or more, or 0 for the default (%d)", n, defaultSettleConcurrency)
	}
	s := cfg.Server
	if s.LookupQuery != "" {
		if s.Lookup != nil {
			refuse("Config.Server: Server.Lookup and Server.LookupQuery are both set: give one")
		}
		if err := checkLookupQuery(s.LookupQuery); err != nil {
			errs = append(errs, err)
		}
	}
	// Checked as the defaults will make them, with the rest.
	if retention, margin := cmp.Or(s.Retention, defaultRetention), cmp.Or(s.RetentionMargin, defaultSafetyMargin); retention < 0 || margin < 0 || margin >= retention {
		refuse("Config.Server: retention %s with margin %s leaves no time to send: Server.RetentionMargin must be below Server.Retention (0 means 24h and 1h), neither negative", retention, margin)
	}
	if s.ReconcileDelay < 0 {
		refuse("Config.Server.ReconcileDelay is %s: use a positive delay, or 0 for the default (%s)", s.ReconcileDelay, defaultReconcileDelay)
	}
	if s.MaxResponseBytes < 0 {
		refuse("Config.Server.MaxResponseBytes is %d: use a positive size, or 0 for the default (%d)", s.MaxResponseBytes, defaultMaxResponseBytes)
	}
	for _, name := range s.StoredHeaders {
		if err := checkStoredHeader(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// validate reports the fields of p that are out of range; from names
// where p came from (Config.RetryPolicy or ContextWithRetryPolicy).
func (p RetryPolicy) validate(from string) error {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("idem: %s.%s is %v: %s", from, field, v, want))
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
	return p.validate("ContextWithRetryPolicy: RetryPolicy")
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
		return fmt.Errorf("idem: Config.Server.StoredHeaders holds %q: not a header field name", name)
	}
	if w := credentialWord(name); w != "" {
		return fmt.Errorf("idem: Config.Server.StoredHeaders holds %q: the field carries credentials or session state (%q), which are never written to the device; keep what the app needs of it in memory", http.CanonicalHeaderKey(name), w)
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
			return fmt.Errorf("idem: Config.Server.LookupQuery is %q: give the name of the query parameter alone, such as \"idempotency_key\"", name)
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
