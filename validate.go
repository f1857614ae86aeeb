package idem

import (
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
