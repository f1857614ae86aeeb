package idem

import "time"

// Arm arms an intent as its first Do does, without sending it: the state
// of an app that crashed between the tap's write and the first byte.
var Arm = (*Client).arm

// Remembered returns how many live requests rt holds intents for.
func Remembered(rt any) int {
	t := rt.(*roundTripper)
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sent)
}

// Tracked returns how many intents c holds state for in memory.
func Tracked(c *Client) int {
	c.keys.mu.Lock()
	n := len(c.keys.unsent) + len(c.keys.dropped) + len(c.keys.created) + len(c.keys.lastSent)
	c.keys.mu.Unlock()
	c.actionMu.Lock()
	defer c.actionMu.Unlock()
	return n + len(c.unarmed)
}

// The bounds on Prune's tombstones.
const (
	TombstoneLifetime = tombstoneLifetime
	MaxTombstones     = maxTombstones
)

// Options that set one field of the Server as WithServer sets them all, so
// that a test names only the field it is about.

func WithLookup(lookup func(req Request, key string) string) Option {
	return func(c *config) { c.lookup = lookup }
}

func LookupQuery(param string) func(req Request, key string) string { return lookupQuery(param) }

func WithQuotedKey() Option { return func(c *config) { c.quoted = true } }

func WithRetention(retention, margin time.Duration) Option {
	return func(c *config) { c.retention, c.margin = retention, margin }
}

func WithReconcileDelay(d time.Duration) Option { return func(c *config) { c.reconcile = d } }

func WithMaxResponseBytes(n int64) Option { return func(c *config) { c.maxBody = n } }

func WithStoredHeaders(names ...string) Option {
	return func(c *config) { c.keptHeaders = append(c.keptHeaders, names...) }
}

func WithKeyReusedAnswer(f func(resp *Response) bool) Option {
	return func(c *config) { c.isKeyReused = f }
}

func WithServerAnswer(f func(resp *Response) bool) Option {
	return func(c *config) { c.isServerAnswer = f }
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
