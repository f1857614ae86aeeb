package idem

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// Option configures a Client: a function that sets one setting, applied
// by New in order. New checks every option's value and fails with an error
// that names each one out of range. A nil function or logger means none,
// as without the option; a nil store, http.Client or clock is refused
// (leave the option out to get the default).
type Option func(*config)

// config is a Client's settings, as the options set them.
type config struct {
	http      *http.Client
	store     persist.Store
	logger    *slog.Logger // nil: silent
	clock     clock.Clock
	policy    RetryPolicy
	retention time.Duration
	margin    time.Duration
	reconcile time.Duration
	maxBody   int64 // bytes read of one answer, header fields included
	quoted    bool
	onAttempt func(Attempt)
	lookup    func(Request, string) string // nil: none configured
	// isKeyReused recognises the app's own server's key reuse answers.
	isKeyReused func(*Response) bool
	// isServerAnswer recognises the app's own server's unmarked answers.
	isServerAnswer func(*Response) bool
	// keptHeaders are the canonical names of the answer's header fields
	// kept on the device.
	keptHeaders []string
	retryBudget RetryBudget  // the client-wide retry budget (WithRetryBudget)
	settles     settleConfig // SettleAll's (WithSettleConcurrency, WithSettleProgress)
	invalid     []error      // what the options got wrong (see validate)
	// lookupInvalid is what the last WithServer got wrong in its lookup.
	lookupInvalid []error
}

// newConfig applies opts in order, refuses every value out of range, and
// fills in the defaults.
func newConfig(opts []Option) (config, error) {
	var c config
	for _, o := range opts {
		if o == nil {
			c.refuse("New: an Option is nil")
			continue
		}
		o(&c)
	}
	if err := c.validate(); err != nil {
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
	c.invalid, c.lookupInvalid = nil, nil
	return c, nil
}

// log logs to the app's logger, if it gave one.
func (c *config) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if c.logger != nil {
		c.logger.Log(ctx, level, msg, args...)
	}
}

// WithHTTPClient sends through hc, so the app keeps its transport, proxies,
// TLS settings, tracing and per-attempt Timeout. The default is an
// http.Client on http.DefaultTransport with a 30s timeout per attempt.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *config) { c.refuseNil("WithHTTPClient", hc, "an *http.Client"); c.http = hc }
}

// WithStore keeps intents in s. The default is persist.NewMemory(nil),
// which does not survive a restart; use persist.OpenDir on a device.
func WithStore(s persist.Store) Option {
	return func(c *config) {
		c.refuseNil("WithStore", s, "a persist.Store (persist.OpenDir on a device)")
		c.store = s
	}
}

// WithLogger logs retries and outcomes to l. The default is silence.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithClock replaces the system clock, for tests of waiting: pass a
// clock.Manual, and the same one to the fake server. The clock drives every
// wait and time limit of a call: the backoff between attempts, Retry-After
// waits, RetryPolicy.MaxElapsed, the context's deadline (taken as the time
// it leaves, from the clock's now) and the intent's age against
// Server.Retention; it also stamps records (CreatedAt, UpdatedAt), from which
// Reconcile counts its delay. Network I/O runs in real time: an attempt is
// given what is left of the budget on the clock as a real-time limit (see
// RetryPolicy.MaxElapsed). A clock that also has a method
// Monotonic() time.Duration (as clock.Manual does) lets tests set its wall
// time anywhere while idem measures elapsed time on its monotonic reading,
// as it does with the system clock; one with SinceBoot, as clock.Manual
// has, stands for the clock that counts device sleep.
func WithClock(clk clock.Clock) Option {
	return func(c *config) {
		c.refuseNil("WithClock", clk, "a clock.Clock (clock.NewManual in tests)")
		c.clock = clk
	}
}

// WithRetryPolicy sets when to retry and how long to wait. New refuses a
// policy with a field out of range (see RetryPolicy).
func WithRetryPolicy(p RetryPolicy) Option { return func(c *config) { c.policy = p } }

// WithAttemptHook calls f after every attempt with its outcome and the wait
// chosen before the next one. f runs on the goroutine of the call and must
// not block; calls made at once (SettleAll settles a few intents at a time)
// call it from several goroutines at once.
func WithAttemptHook(f func(Attempt)) Option { return func(c *config) { c.onAttempt = f } }

// Defaults of a Client; each can be changed with an Option.
const (
	// defaultRetention is the server's retention of idempotency records
	// that the client assumes (the contract's default).
	defaultRetention = 24 * time.Hour
	// defaultSafetyMargin is how long before the server's retention ends
	// the client stops sending a key.
	defaultSafetyMargin = time.Hour
	// defaultReconcileDelay is how long after an intent's last attempt a
	// "not found" from the server's lookup is trusted to mean "never done".
	// It is the longest time the client assumes a request may take from
	// the device to the server's record: held in the network or a proxy's
	// queue, then the server's lease and processing time. A request held
	// longer than that (a proxy that queues it for an hour) can arrive
	// after a "not found" was trusted; only a server that refuses stale
	// requests could close that, and the contract has no such rule.
	defaultReconcileDelay = 2 * time.Minute
	// defaultMaxResponseBytes bounds what is read of one answer: its
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
