package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// Config configures a Client, given to New. Each field left zero takes the
// default its comment gives, so New(Config{}) is a Client that keeps
// intents in memory and sends through an http.Client of its own. New
// checks every field and fails with one error that names each field out of
// range and says what to give instead. A Client never changes after New.
type Config struct {
	// Store keeps the intents. Nil means persist.NewMemory(nil), which
	// does not survive a restart: on a device, pass persist.OpenDir's
	// store. New refuses a store that is a nil pointer (an OpenDir whose
	// error was dropped), which would otherwise panic at the first tap.
	Store persist.Store

	// HTTPClient sends the attempts, so the app keeps its transport,
	// proxies, TLS settings, tracing and per-attempt Timeout. Nil means an
	// http.Client on http.DefaultTransport with a 30s timeout per attempt.
	HTTPClient *http.Client

	// Server describes the app's server: its lookup, its retention, how it
	// spells keys and marks its answers (see Server). The zero Server
	// follows the contract and has no lookup.
	Server Server

	// RetryPolicy says when to retry and how long to wait (see
	// RetryPolicy; zero fields take its defaults). One call's own policy
	// comes from its context (ContextWithRetryPolicy).
	RetryPolicy RetryPolicy

	// RetryBudget is the client-wide retry budget shared by every call
	// (see RetryBudget); the zero value is on, with its defaults.
	RetryBudget RetryBudget

	// Clock replaces the system clock, for tests of waiting: pass a
	// clock.Manual, and the same one to the fake server. The clock drives
	// every wait and time limit of a call: the backoff between attempts,
	// Retry-After waits, RetryPolicy.MaxElapsed, the context's deadline
	// (taken as the time it leaves, from the clock's now) and the intent's
	// age against Server.Retention; it also stamps records (CreatedAt,
	// UpdatedAt), from which Reconcile counts its delay. Network I/O runs
	// in real time: an attempt is given what is left of the budget on the
	// clock as a real-time limit (see RetryPolicy.MaxElapsed). A clock
	// that also has a method Monotonic() time.Duration (as clock.Manual
	// does) lets tests set its wall time anywhere while idem measures
	// elapsed time on its monotonic reading, as it does with the system
	// clock; one with SinceBoot, as clock.Manual has, stands for the clock
	// that counts device sleep. Nil means the system clock.
	Clock clock.Clock

	// Logger receives retries and outcomes. Nil means silence.
	Logger *slog.Logger

	// OnAttempt is called after every attempt with its outcome and the
	// wait chosen before the next one. It runs on the goroutine of the
	// call and must not block; calls made at once (SettleAll settles a few
	// intents at a time) call it from several goroutines at once. Nil
	// means none.
	OnAttempt func(Attempt)

	// SettleConcurrency is how many intents SettleAll settles at once:
	// from 1 (one after the other, oldest first) up. Zero means 4: a
	// device at app start should not open many connections at once, and
	// settles wait mostly on the network. New refuses a negative number.
	SettleConcurrency int

	// SettleProgress is called as SettleAll is done with each intent,
	// with what became of it (as SettleAll's result will hold it), how
	// many intents it is done with, this one included, and how many it
	// will report in all: for a progress bar, or to show each payment's
	// outcome as it arrives rather than after the slowest. SettleAll makes
	// the calls one at a time, done counting up from 1 to total, on the
	// goroutine that settled the intent; it must return promptly, as the
	// next report waits for it (the settles go on meanwhile). Nil reports
	// nothing. If it panics, SettleAll calls it no more, finishes its
	// settles, and then panics with the same value on its caller's
	// goroutine.
	//
	// A callback rather than an iterator: SettleAll settles several
	// intents at once on goroutines of its own, which a callback can
	// report from as they end, while an iterator would hold each settle
	// until the app's loop asks for its result; and a callback crosses to
	// Kotlin and Swift (the mobile facade) as a listener, which an
	// iterator does not.
	SettleProgress func(s Settled, done, total int)
}

// config is a Client's settings, as New made them of its Config.
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
	retryBudget RetryBudget  // the client-wide retry budget (Config.RetryBudget)
	settles     settleConfig // SettleAll's (Config.SettleConcurrency, Config.SettleProgress)
}

// newConfig refuses every field of cfg out of range, all in one error,
// then fills in the defaults.
func newConfig(cfg Config) (config, error) {
	c := config{
		http:        cfg.HTTPClient,
		store:       cfg.Store,
		logger:      cfg.Logger,
		clock:       cfg.Clock,
		policy:      cfg.RetryPolicy,
		onAttempt:   cfg.OnAttempt,
		retryBudget: cfg.RetryBudget,
		settles:     settleConfig{workers: cfg.SettleConcurrency, progress: cfg.SettleProgress},
	}
	c.setServer(cfg.Server)
	if err := cfg.validate(); err != nil {
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

// log logs to the app's logger, if it gave one.
func (c *config) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if c.logger != nil {
		c.logger.Log(ctx, level, msg, args...)
	}
}

// Defaults of a Client; each can be changed in its Config.
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

// setServer takes what the Client knows of the app's server from s
// (Config.validate has checked it).
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
	c.isKeyReused = s.KeyReusedAnswer
	c.isServerAnswer = s.OwnAnswer
}
