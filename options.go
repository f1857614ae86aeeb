package idem

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
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
	if c.retention < 0 || c.margin < 0 || c.margin >= c.retention {
		return config{}, fmt.Errorf("idem: retention %s with margin %s leaves no time to send", c.retention, c.margin)
	}
	if c.reconcile <= 0 {
		c.reconcile = defaultReconcileDelay
	}
	if c.maxBody <= 0 {
		c.maxBody = defaultMaxResponseBytes
	}
	c.keptHeaders = keptHeaders(c.keptHeaders)
	c.settles.workers = cmp.Or(c.settles.workers, defaultSettleConcurrency)
	c.invalid = nil
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

// Server describes the app's server to a Client: how to ask it what became
// of a key, how it spells and keeps keys, and what its answers look like.
// It is set whole with WithServer. The zero Server is a server that
// follows the contract (docs/CONTRACT.md) and has no lookup: each field
// left zero keeps the default its comment gives.
type Server struct {
	// Lookup returns the URL of a GET that asks the server what became of
	// key without sending the intent again: it answers 2xx with the effect
	// made under key, or 404 when there is none. Reconcile and Settle use
	// it; it is the one place an app builds that URL. Without a lookup
	// (Lookup nil and LookupQuery empty), an intent too old to send again
	// cannot be settled.
	Lookup func(req Request, key string) string
	// LookupQuery is the lookup of a server that finds the effect of a key
	// at the intent's own URL, with the key in the query parameter it
	// names: for an intent that POSTs to https://api.example/payments,
	// LookupQuery "idempotency_key" asks
	// GET https://api.example/payments?idempotency_key=K, as the contract
	// does. New refuses a Server with both Lookup and LookupQuery.
	LookupQuery string

	// QuotedKey sends the key as an RFC 8941 sf-string ("..."), as the
	// IETF draft writes it. False sends the bare value deployed APIs
	// expect.
	QuotedKey bool

	// Retention is how long the server keeps idempotency records, and
	// RetentionMargin how long before that the client stops sending a key.
	// An intent older than Retention-RetentionMargin is not sent again:
	// its outcome is reported unknown (a *RetryError whose Reason says the
	// intent expired) and Settle settles it through the lookup. Zero
	// values mean 24 hours (the contract's retention) and one hour; New
	// refuses a margin that leaves no time to send.
	Retention, RetentionMargin time.Duration

	// ReconcileDelay is how long after an intent's last attempt a "not
	// found" from the lookup in Reconcile is trusted: the longest a
	// request may take from the device to the server's record, held in
	// the network or a proxy's queue, then the server's lease and
	// processing time. A request held longer than that (a proxy that
	// queues it for an hour) can arrive after a "not found" was trusted;
	// only a server that refuses stale requests could close that, and the
	// contract has no such rule. Zero means 2 minutes; New refuses a
	// negative delay.
	ReconcileDelay time.Duration

	// MaxResponseBytes bounds what is read and kept of one answer: its
	// header fields (as received; the transport's MaxResponseHeaderBytes
	// bounds what it reads of them, 10 MiB by default) and its body
	// together. A larger final answer still resolves the intent from its
	// status, but its body is not kept: the Response says Oversized. Zero
	// means 10 MiB; New refuses a negative size.
	MaxResponseBytes int64

	// StoredHeaders names header fields of final answers to keep on the
	// device besides those kept by default: Content-Type, Location,
	// Idempotent-Replayed and Retry-After. No other field is stored
	// (cookies, tokens and the like stay off the disk); the Response of
	// the call that got the answer carries all its fields, a Response
	// read from the store only the kept ones. New refuses a name that is
	// not a field name, and one that carries credentials or session
	// state: a name with cookie, auth, token, secret, password, session,
	// api-key, credential or csrf in it (Set-Cookie, Authorization,
	// X-Auth-Token, ...).
	StoredHeaders []string

	// KeyReusedAnswer recognises how the server says that a key was used
	// with a different request, when it says it otherwise than the
	// contract (a 422 problem of type .../idempotency-key-reused) or
	// Stripe (an error of type idempotency_error). It sees each final
	// answer that is not a 2xx and reports whether it is such a refusal;
	// the intent is then rejected and the error matches ErrKeyReused. It
	// must not keep resp. Nil recognises only those two.
	KeyReusedAnswer func(resp *Response) bool

	// OwnAnswer recognises the server's answers when the server does not
	// mark them as the contract asks (the request's Idempotency-Key echoed
	// back, or Idempotent-Replayed: true). Nil requires the mark: an
	// unmarked answer could come from a CDN, a gateway or a captive portal
	// in front of the server, and idem never lets such an answer settle an
	// intent (see the package documentation, "Whose word settles an
	// intent"). It sees the answers that lack the mark, body included (nil
	// when over MaxResponseBytes), and reports whether one is the
	// server's own: a header field or body only the server sends, say.
	// Recognised, an answer is taken as the server's word: a 2xx or a 4xx
	// from a send settles the intent, a lookup's 2xx makes it succeeded
	// and a lookup's 404 makes it void. It must not keep resp.
	OwnAnswer func(resp *Response) bool
}

// WithServer describes the app's server (see Server). A later WithServer
// replaces an earlier one whole.
func WithServer(s Server) Option {
	return func(c *config) {
		c.lookup = s.Lookup
		if s.LookupQuery != "" {
			if s.Lookup != nil {
				c.refuse("WithServer: Server.Lookup and Server.LookupQuery are both set: give one")
			}
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
}

// lookupQuery is the lookup of Server.LookupQuery: the intent's own URL
// with the key in the query parameter param.
func lookupQuery(param string) func(req Request, key string) string {
	return func(req Request, key string) string {
		u, err := url.Parse(req.URL)
		if err != nil {
			// Intents hold validated absolute URLs.
			return ""
		}
		q := u.Query()
		q.Set(param, key)
		u.RawQuery = q.Encode()
		u.Fragment = ""
		return u.String()
	}
}

// keptHeaders returns the defaults and the app's names, canonical and
// without repeats.
func keptHeaders(names []string) []string {
	out := append([]string(nil), storedHeaders...)
	for _, n := range names {
		n = http.CanonicalHeaderKey(n)
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

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
