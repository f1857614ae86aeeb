package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// Config configures a Client, given to New. Server.Mark is required. Each
// other field left zero takes the default its comment gives. So
// New(Config{Server: Server{Mark: MarkEcho}}) is a Client of a server that
// echoes the key. That Client keeps intents in memory and sends through its
// own http.Client. New checks every field. It fails with one error that
// names each field out of range. The error says what to give instead. A
// Client never changes after New.
type Config struct {
	// Store keeps the intents. Nil means persist.NewMemory(nil), which does
	// not survive a restart. On a device, pass persist.OpenDir's store. New
	// refuses a store that is a nil pointer, as from an OpenDir whose error
	// was dropped. That store would panic at the first tap.
	Store persist.Store

	// HTTPClient sends the attempts. So the app keeps its transport,
	// proxies, TLS settings and tracing. It keeps its Timeout per attempt
	// too. Nil means an http.Client on http.DefaultTransport with a 30s
	// timeout per attempt.
	HTTPClient *http.Client

	// Server describes the app's server (see Server). It says how the server
	// marks its answers and spells keys. It gives the server's lookup and
	// retention. Its Mark is required, and New refuses a Config without one.
	Server Server

	// RetryPolicy says when to retry and how long to wait (see RetryPolicy).
	// Its zero fields take its defaults. One call's own policy comes from
	// its context (ContextWithRetryPolicy).
	RetryPolicy RetryPolicy

	// RetryBudget is the client-wide retry budget that every call shares.
	// (See RetryBudget.) Its zero value is on, with its defaults.
	RetryBudget RetryBudget

	// Clock replaces the system clock, for tests of waiting. Pass a
	// clock.Manual, and the same one to the fake server. The clock drives
	// every wait and time limit of a call:
	//
	//   - the backoff between attempts and Retry-After waits;
	//   - RetryPolicy.MaxElapsed;
	//   - the context's deadline, taken as the time it leaves from the
	//     clock's now;
	//   - the intent's age against Server.Retention.
	//
	// It also stamps records (CreatedAt, UpdatedAt). Reconcile counts its
	// delay from those stamps. Network I/O runs in real time. An attempt
	// gets what is left of the budget on the clock as a real-time limit.
	// (See RetryPolicy.MaxElapsed.) A clock may also have a method
	// Monotonic() time.Duration, as clock.Manual does. Then tests can set
	// its wall time anywhere. idem still measures elapsed time on its
	// monotonic reading, as with the system clock. A clock with SinceBoot,
	// as clock.Manual has, stands for the clock that counts device sleep.
	// Nil means the system clock.
	Clock clock.Clock

	// Logger receives retries and outcomes. Nil means silence.
	Logger *slog.Logger

	// OnAttempt is called after every attempt. It gets the attempt's outcome
	// and the wait chosen before the next one. It runs on the call's
	// goroutine and must not block. Calls made at once call it from several
	// goroutines at once. (SettleAll settles a few intents at a time.) Nil
	// means none.
	OnAttempt func(Attempt)

	// Authorizer returns the credentials of one attempt of the intent with
	// key. That is the value of its Authorization header, such as "Bearer "
	// and a fresh token. An empty value sends none. The call runs it before
	// each attempt. So a token that expired between a crash and the resume
	// is refreshed. Its value is never stored with the intent.
	//
	// An error ends the call. If no attempt of the intent wrote its request,
	// the error wraps ErrNotSent and the Authorizer's error. (httptrace's
	// WroteHeaders tells whether one did.) Otherwise the outcome is unknown.
	// A value net/http cannot send ends the call the same way. Such a value
	// has a control character, such as a trailing newline. The error never
	// shows the value.
	//
	// The lookup asks the Authorizer too, for the intent's key. (Reconcile
	// uses the lookup, and so does Settle of an intent too old to send.) The
	// lookup acts for the intent's caller. The Authorizer's error ends it
	// with the outcome unknown. A redirect (307, 308) to another host
	// carries no credentials. (net/http drops them.) Nil means none, and the
	// http.Client's transport may set them instead.
	Authorizer func(ctx context.Context, key string) (string, error)

	// SettleConcurrency is how many intents SettleAll settles at once. It is
	// 1 or more. With 1 they are settled one after the other, oldest first,
	// in the caller's goroutine. Zero means 4. A device at app start should
	// not open many connections at once. And settles wait mostly on the
	// network. New refuses a negative number.
	SettleConcurrency int

	// SettleProgress is called as SettleAll is done with each intent. It
	// gets what became of the intent, as SettleAll's result will hold it. It
	// gets done, the count of intents done so far with this one. And it gets
	// total, the count SettleAll will report in all. Use it for a progress
	// bar. Or use it to show each payment's outcome as it arrives, not after
	// the slowest. SettleAll makes the calls one at a time, done counting up
	// from 1 to total. Each call runs on the goroutine that settled the
	// intent. It must return promptly, as the next report waits for it. (The
	// settles go on meanwhile.) Nil reports nothing. If it panics, SettleAll
	// calls it no more and finishes its settles. Then SettleAll panics with
	// the same value on its caller's goroutine.
	//
	// It is a callback, not an iterator, for two reasons. SettleAll settles
	// several intents at once on its own goroutines. A callback reports each
	// as it ends. An iterator would hold each settle until the app's loop
	// asks for it. And a callback crosses to Kotlin and Swift as a listener,
	// through the mobile facade. An iterator does not.
	SettleProgress func(s Settled, done, total int)
}

// config is a Client's settings, as New made them of its Config.
type config struct {
	// lifeConfig holds the settings the steps of an intent's life read:
	// store, logger, clock, retention, margin and answer rules. Their one
	// home is here; life points to it.
	lifeConfig
	http        *http.Client
	policy      RetryPolicy
	reconcile   time.Duration
	quoted      bool
	onAttempt   func(Attempt)
	authorize   func(context.Context, string) (string, error) // nil: none
	lookup      func(Request, string) string                  // nil: none configured
	retryBudget RetryBudget                                   // the client-wide retry budget (Config.RetryBudget)
	settles     settleConfig                                  // SettleAll's (Config.SettleConcurrency, Config.SettleProgress)
}

// newConfig refuses every field of cfg out of range, all in one error. Then
// it fills in the defaults.
func newConfig(cfg Config) (config, error) {
	c := config{
		lifeConfig:  lifeConfig{store: cfg.Store, logger: cfg.Logger, clock: cfg.Clock},
		http:        cfg.HTTPClient,
		policy:      cfg.RetryPolicy,
		onAttempt:   cfg.OnAttempt,
		authorize:   cfg.Authorizer,
		retryBudget: cfg.RetryBudget,
		settles:     settleConfig{workers: cfg.SettleConcurrency, progress: cfg.SettleProgress},
	}
	c.setServer(cfg.Server)
	if err := cfg.check(); err != nil {
		return config{}, err
	}
	if c.http == nil {
		c.http = &http.Client{Timeout: 30 * time.Second}
	}
	if c.store == nil {
		c.store = persist.NewMemory(nil)
	}
	if c.clock == nil {
		c.clock = clock.System()
	}
	c.policy = c.policy.withDefaults()
	if c.retention == 0 {
		c.retention = defaultRetention
	}
	if c.margin == 0 {
		c.margin = defaultSafetyMargin
	}
	if c.reconcile <= 0 {
		c.reconcile = defaultReconcileDelay
	}
	if c.maxBody <= 0 {
		c.maxBody = defaultMaxResponseBytes
	}
	c.keptHeaders = keptHeaders(c.keptHeaders)
	c.settles.workers = cmp.Or(c.settles.workers, defaultSettleConcurrency)
	return c, nil
}

// keyHeader spells key as this Client sends the keys of new intents.
func (c *config) keyHeader(key string) string {
	if !c.quoted {
		return key
	}
	return quoteKey(key)
}

// Defaults of a Client; each can be changed in its Config.
const (
	// defaultRetention is how long the client assumes the server keeps
	// idempotency records. It is the contract's default.
	defaultRetention = 24 * time.Hour
	// defaultSafetyMargin is how long before the server's retention ends the
	// client stops sending a key.
	defaultSafetyMargin = time.Hour
	// defaultReconcileDelay is how long after an intent's last attempt a
	// lookup's "not found" is trusted. Trusted, it means "never done". It is
	// the longest time the client assumes a request may take to reach the
	// server's record. That counts the network, a proxy's queue, and the
	// server's lease and work. A request held longer can arrive after a "not
	// found" was trusted. (Think of a proxy that queues it for an hour.)
	// Only a server that refuses stale requests could close that gap. The
	// contract has no such rule.
	defaultReconcileDelay = 2 * time.Minute
	// defaultMaxResponseBytes bounds what is read of one answer. It counts
	// header fields and body together.
	defaultMaxResponseBytes = 10 << 20
)

// policyFor returns the policy of a call made with ctx.
func (c *config) policyFor(ctx context.Context) RetryPolicy {
	p, ok := ctx.Value(policyKey{}).(RetryPolicy)
	if !ok {
		return c.policy
	}
	base := c.policy // defaults filled in
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = base.MaxAttempts
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = base.MaxElapsed
	}
	if p.InitialInterval <= 0 {
		p.InitialInterval = base.InitialInterval
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = base.MaxInterval
	}
	if p.Multiplier < 1 {
		p.Multiplier = base.Multiplier
	}
	if p.Jitter == 0 {
		p.Jitter = base.Jitter
		if p.Jitter == 0 {
			p.Jitter = -1 // the Client's: none
		}
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = base.MaxRetryAfter
	}
	return p.withDefaults()
}

// check reports every field of cfg out of range, in one error. It runs
// before any default replaces a value.
func (cfg Config) check() error {
	var errs []error
	refuse := func(format string, args ...any) { errs = append(errs, fmt.Errorf("idem: "+format, args...)) }
	// A nil pointer in an interface is not "none". (It comes from an OpenDir
	// whose error was dropped.) It would panic at the first call.
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
	if err := s.Mark.check(); err != nil {
		errs = append(errs, err)
	}
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

// setServer takes what the Client knows of the app's server from s.
// Config.validate has checked it.
func (c *config) setServer(s Server) {
	c.lookup = s.Lookup
	if s.LookupQuery != "" {
		c.lookup = lookupQuery(s.LookupQuery)
	}
	c.quoted = s.QuotedKey
	c.retention, c.margin = s.Retention, s.RetentionMargin
	c.reconcile = s.ReconcileDelay
	c.maxBody = s.MaxResponseBytes
	c.keptHeaders = slices.Clone(s.StoredHeaders)
	c.keyReusedAnswer = s.KeyReusedAnswer
	c.ownAnswer = s.Mark.own
	c.ownNamesKey = s.Mark.namesKey
}

// validate reports the fields of b out of range. New refuses a field below
// -1, and -1 in the costs.
func (b RetryBudget) validate() error {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("idem: Config.RetryBudget.%s is %v: %s", field, v, want))
	}
	if b.Tokens < -1 {
		bad("Tokens", b.Tokens, "use 1 or more, 0 for the default (500), or -1 for no budget")
	}
	if b.RetryCost < 0 {
		bad("RetryCost", b.RetryCost, "use 1 or more, or 0 for the default (5)")
	}
	if b.TimeoutCost < 0 {
		bad("TimeoutCost", b.TimeoutCost, "use 1 or more, or 0 for the default (10)")
	}
	if b.Refill < 0 && b.Refill != -1 {
		bad("Refill", b.Refill, "use a positive duration, 0 for the default (1s), or -1 for none")
	}
	// The bucket's size, the default's too, must pay the dearest retry.
	if most, size := max(cmp.Or(b.RetryCost, defaultBudgetRetryCost), cmp.Or(b.TimeoutCost, defaultBudgetTimeoutCost)), cmp.Or(b.Tokens, defaultBudgetTokens); b.Tokens >= 0 && most > size {
		bad("Tokens", b.Tokens, fmt.Sprintf("the bucket (%d tokens) is below a retry's cost (%d), so some retries could never be paid: raise Tokens, lower the cost, or use -1 for no budget", size, most))
	}
	return errors.Join(errs...)
}

// check reports a Mark New refuses. That is none declared, or a preset made
// of bad input.
func (m Mark) check() error {
	switch {
	case m.name == "":
		return fmt.Errorf("idem: Config.Server.Mark is not set: declare how the server marks its answers as its own, with %s. "+
			"An answer without the mark never settles an intent: it could be a captive portal's or a CDN's (README, \"How your server marks its answers\")", marks)
	case m.invalid != "":
		return fmt.Errorf("idem: Config.Server.Mark is %s: %s", m.name, m.invalid)
	}
	return nil
}

// isNil reports a value that a method call or a send would panic on. That is
// a nil interface, or one holding a nil pointer, map, func, chan or slice.
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

// validate reports the fields of p that are out of range. from names where p
// came from: Config.RetryPolicy or ContextWithRetryPolicy.
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

// checkPolicy reports a policy from ContextWithRetryPolicy that is out of
// range. The call it would govern is refused before anything is armed or
// sent. It does not run under defaults the app did not ask for.
func checkPolicy(ctx interface{ Value(any) any }) error {
	p, ok := ctx.Value(policyKey{}).(RetryPolicy)
	if !ok {
		return nil
	}
	return p.validate("ContextWithRetryPolicy: RetryPolicy")
}

// checkStoredHeader refuses a name Server.StoredHeaders may not hold. That
// is a name that is not a header field name, or one that carries
// credentials.
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
// parameter's name. A query written out ("idempotency_key=", "?k") is
// refused. So is a name with a space or a control character in it. No lookup
// of the server would find such a name.
func checkLookupQuery(name string) error {
	for _, r := range name {
		if r <= ' ' || r == 0x7f || strings.ContainsRune("=&?#", r) {
			return fmt.Errorf("idem: Config.Server.LookupQuery is %q: give the name of the query parameter alone, such as \"idempotency_key\"", name)
		}
	}
	return nil
}
