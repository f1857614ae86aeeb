package idem

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// Arm arms an intent as its first Do does, without sending it: the state
// of an app that crashed between the tap's write and the first byte.
var Arm = (*Client).arm

// Tracked returns how many intents c holds state for in memory.
func Tracked(c *Client) int {
	n := c.keys.tracked()
	c.actionMu.Lock()
	defer c.actionMu.Unlock()
	return n + len(c.unarmed)
}

// The bounds on Prune's tombstones.
const (
	TombstoneLifetime = tombstoneLifetime
	MaxTombstones     = maxTombstones
)

// Option sets one field of a Config, so that a test names only the
// settings it is about; NewWith applies them in order to a zero Config.
type Option func(*Config)

// NewWith is New with the Config that opts make, from a Config whose
// server echoes the key (MarkEcho), as the fake server does.
func NewWith(opts ...Option) (*Client, error) {
	cfg := Config{Server: Server{Mark: MarkEcho}}
	for _, o := range opts {
		o(&cfg)
	}
	return New(cfg)
}

func WithStore(s persist.Store) Option       { return func(c *Config) { c.Store = s } }
func WithHTTPClient(hc *http.Client) Option  { return func(c *Config) { c.HTTPClient = hc } }
func WithServer(s Server) Option             { return func(c *Config) { c.Server = s } }
func WithRetryPolicy(p RetryPolicy) Option   { return func(c *Config) { c.RetryPolicy = p } }
func WithRetryBudget(b RetryBudget) Option   { return func(c *Config) { c.RetryBudget = b } }
func WithClock(clk clock.Clock) Option       { return func(c *Config) { c.Clock = clk } }
func WithLogger(l *slog.Logger) Option       { return func(c *Config) { c.Logger = l } }
func WithAttemptHook(f func(Attempt)) Option { return func(c *Config) { c.OnAttempt = f } }
func WithSettleConcurrency(n int) Option     { return func(c *Config) { c.SettleConcurrency = n } }
func WithSettleProgress(f func(Settled, int, int)) Option {
	return func(c *Config) { c.SettleProgress = f }
}

// Options that set one field of the Server, so that a test names only the
// field it is about.

func WithLookup(lookup func(req Request, key string) string) Option {
	return func(c *Config) { c.Server.Lookup = lookup }
}

func LookupQuery(param string) func(req Request, key string) string { return lookupQuery(param) }

func WithQuotedKey() Option { return func(c *Config) { c.Server.QuotedKey = true } }

func WithRetention(retention, margin time.Duration) Option {
	return func(c *Config) { c.Server.Retention, c.Server.RetentionMargin = retention, margin }
}

func WithReconcileDelay(d time.Duration) Option {
	return func(c *Config) { c.Server.ReconcileDelay = d }
}

func WithMaxResponseBytes(n int64) Option { return func(c *Config) { c.Server.MaxResponseBytes = n } }

func WithStoredHeaders(names ...string) Option {
	return func(c *Config) { c.Server.StoredHeaders = append(c.Server.StoredHeaders, names...) }
}

func WithKeyReusedAnswer(f func(resp *Response) bool) Option {
	return func(c *Config) { c.Server.KeyReusedAnswer = f }
}

func WithServerAnswer(f func(resp *Response) bool) Option {
	return func(c *Config) { c.Server.Mark = MarkRecognizer(f) }
}

// StopReason and the reasons a RetryError gives, as tests compare them.
type StopReason = string

const (
	StopAttempts            = stopAttempts
	StopElapsed             = stopElapsed
	StopDeadline            = stopDeadline
	StopRetryAfterCap       = stopRetryAfterCap
	StopCanceled            = stopCanceled
	StopExpired             = stopExpired
	StopFatal               = stopFatal
	StopRedirect            = stopRedirect
	StopUnmarked            = stopUnmarked
	StopRedirectedKeyReused = stopRedirectedKeyReused
	StopRetryBudget         = stopRetryBudget
)

// NotSentError is the error that matches ErrNotSent, as tests inspect it.
type NotSentError = notSentError
