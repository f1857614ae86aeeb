package idem

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemkit/idem/clock"
)

// RetryPolicy says when to retry and how long to wait. A zero RetryPolicy
// consists entirely of defaults:
//
//   - 10 attempts and 2 minutes per call;
//   - backoff from 500ms, doubling up to 30s, with ±50% jitter;
//   - a Retry-After cap of 60s.
//
// One budget governs a call: MaxAttempts, MaxElapsed and the context's
// deadline. The first to run out ends the call with a *RetryError that says
// which.
type RetryPolicy struct {
	// MaxAttempts is the most attempts one call puts on the wire. Zero means
	// 10.
	MaxAttempts int
	// MaxElapsed bounds the time of one call, waits and attempts included.
	// Each attempt is given what is left of it, whatever the http.Client's
	// Timeout. An attempt that runs out ends the call with an unknown
	// outcome. It may have reached the server. MaxElapsed is counted on the
	// Client's Clock (Config.Clock). An attempt's I/O runs in real time. So
	// an attempt gets the budget left at its start, read on the Clock, as a
	// real-time limit. Zero means 2 minutes.
	MaxElapsed time.Duration
	// InitialInterval is the first backoff wait. Zero means 500ms.
	InitialInterval time.Duration
	// MaxInterval caps a backoff wait. Zero means 30s.
	MaxInterval time.Duration
	// Multiplier grows the backoff each attempt. Zero means 2.
	Multiplier float64
	// Jitter spreads each backoff wait by ±Jitter of itself. It spreads a
	// Retry-After wait by up to Jitter/5 past it. So clients that failed
	// together do not retry together. It is a fraction above 0, at most 1.
	// Zero means 0.5. -1 turns jitter off, so every wait is exactly as
	// computed. (Tests that count waits want that.) New refuses any other
	// value, and so do calls made under ContextWithRetryPolicy.
	Jitter float64
	// MaxRetryAfter is the longest Retry-After the client will honour. A
	// server asking for more ends the call at once, its outcome unknown. The
	// call does not block the app. Zero means 60s.
	MaxRetryAfter time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 10
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = 2 * time.Minute
	}
	if p.InitialInterval <= 0 {
		p.InitialInterval = 500 * time.Millisecond
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = 30 * time.Second
	}
	if p.MaxInterval < p.InitialInterval {
		p.MaxInterval = p.InitialInterval
	}
	if p.Multiplier < 1 {
		p.Multiplier = 2
	}
	switch {
	case p.Jitter < 0: // -1: none
		p.Jitter = 0
	case p.Jitter == 0:
		p.Jitter = 0.5
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = 60 * time.Second
	}
	return p
}

type policyKey struct{}

// ContextWithRetryPolicy returns a context whose calls retry under p. Under
// it, calls of the Client use p rather than the Client's policy. Those calls
// are Do, Send, Settle, SettleAll and requests through its RoundTripper. So
// one Client can give a tap in the foreground a short budget. It can give a
// settle in the background a long one. Fields of p left zero keep the
// Client's values. A field may be out of range (see New). Then each call
// under ctx fails at once with an error that names it. It fails before
// anything is armed or sent.
func ContextWithRetryPolicy(ctx context.Context, p RetryPolicy) context.Context {
	return context.WithValue(ctx, policyKey{}, p)
}

// Attempt describes one attempt, for the hook set in Config.OnAttempt.
type Attempt struct {
	Key    string
	Number int // 1 for the first attempt of a call
	// StatusCode is the answer's status, or 0 when the attempt got none.
	StatusCode int
	// Err is the network error, if any. The URL a *url.Error names is
	// redacted as URL is, with the user name always.
	Err error
	// Retry says whether another attempt follows, after Wait.
	Retry bool
	Wait  time.Duration
	// Name is the intent's action name. It is "" for a request of the
	// RoundTripper without an intent.
	Name string
	// URL is the intent's URL with no credential in it. A password and a
	// user name without a password are redacted. So are the values of query
	// parameters named for credentials (access_token, api_key). The fragment
	// is dropped.
	URL string
	// Duration is how long the attempt took, from its start to its answer or
	// error. It is on the Client's clock (Config.Clock).
	Duration time.Duration
	// Context is the context of the call the attempt belongs to. It is as
	// the app passed it to Do, Send, Settle or SettleAll. Or it is as the
	// request carried it through the RoundTripper. A hook finds the caller's
	// trace span and log values in it. It may have ended, in a canceled
	// call. It is never nil.
	Context context.Context
}

// maxRetryAfterSeconds bounds delta-seconds before conversion. So a
// Retry-After of ten years or of 2^80 is a long wait, not an overflow.
const maxRetryAfterSeconds = math.MaxInt64 / int64(time.Second)

// parseRetryAfter reads a Retry-After value relative to now. The value is
// delta-seconds ("120") or an HTTP-date. The date may be in any of the three
// forms http.ParseTime accepts. A date in the past means no wait. ok is
// false for an empty or malformed value, which callers treat as absent. Very
// large values saturate rather than overflow.
func parseRetryAfter(value string, now time.Time) (wait time.Duration, ok bool) {
	v := strings.TrimSpace(value)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		for i := 0; i < len(v); i++ {
			if v[i] < '0' || v[i] > '9' {
				return 0, false
			}
		}
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > maxRetryAfterSeconds {
			// Only digits, so the error is a range error, and the value
			// saturates.
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	if d < 0 {
		d = 0
	}
	return d, true
}

// stop says why a call gives up before its next attempt.
type stop struct {
	reason string
	wait   time.Duration
}

// budget is the retry state of one call. It is confined to the goroutine of
// that call, as backoff.ExponentialBackOff requires.
type budget struct {
	policy   RetryPolicy
	clock    clock.Clock
	backoff  *backoff.ExponentialBackOff // nil until the first retry
	start    time.Time
	deadline time.Time // the context's, or zero
	// left says how long the intent may still be sent. It is read anew from
	// every clock each time. An instant on the clock's timeline would not
	// move while the device sleeps. Nil means no limit.
	// It also says how long the call may still begin a send, from the
	// deadline its record stores, on the same reading.
	left     lefter
	attempts int
}

// lefter says how long an intent may still be sent (window) and how long
// a call may still begin a send (send), on one reading of the clocks. A
// wait and an attempt check both. One reading serves both.
type lefter interface {
	lefts() (window, send time.Duration)
}

// leftFunc is a lefter made of a function. It bounds no send.
type leftFunc func() time.Duration

func (f leftFunc) lefts() (time.Duration, time.Duration) { return f(), math.MaxInt64 }

func newBudget(ctx context.Context, p RetryPolicy, clk clock.Clock, left lefter) budget {
	b := budget{policy: p, clock: clk, start: clk.Now(), left: left}
	if d, ok := ctx.Deadline(); ok {
		// A context deadline is an instant on the real clock. Every other
		// time of the budget is on the injected one. So the deadline is put
		// on the budget's timeline as the time it leaves. That time counts
		// from the injected clock's now, so the two never mix.
		b.deadline = b.start.Add(time.Until(d))
	}
	return b
}

// next decides how long to wait before the next attempt, or why not to make
// one. It runs after attempt b.attempts failed in a retryable way. The wait
// is the jittered backoff. It is raised to the server's Retry-After when
// that is longer. So a retry never comes sooner than the server asked.
func (b *budget) next(resp *http.Response) (time.Duration, *stop) {
	if b.attempts >= b.policy.MaxAttempts {
		return 0, &stop{reason: stopAttempts}
	}
	if b.backoff == nil {
		// It is made on the first retry, for most calls succeed at once.
		b.backoff = backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(b.policy.InitialInterval),
			backoff.WithMaxInterval(b.policy.MaxInterval),
			backoff.WithMultiplier(b.policy.Multiplier),
			backoff.WithRandomizationFactor(b.policy.Jitter),
			backoff.WithMaxElapsedTime(0), // the budget decides when to stop
			backoff.WithClockProvider(b.clock),
		)
	}
	now := b.clock.Now()
	wait := b.backoff.NextBackOff()
	if wait > b.policy.MaxInterval || wait < 0 {
		// At the cap the wait is jittered below it. Otherwise about half the
		// waits of clients that failed together would land on the cap
		// together.
		wait = time.Duration((1 - rand.Float64()*b.policy.Jitter) * float64(b.policy.MaxInterval))
	}
	var spread time.Duration
	if resp != nil {
		if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), now); ok {
			if ra > b.policy.MaxRetryAfter {
				return 0, &stop{reason: stopRetryAfterCap, wait: ra}
			}
			if ra >= wait {
				wait = ra
				// Clients told the same Retry-After would all come back in
				// the same instant. So the waits are spread over up to a
				// fifth of Jitter past it. (That is 10% by default.) A wait
				// is never sooner than the server asked.
				if b.policy.Jitter > 0 {
					// The total never passes math.MaxInt64. wait+spread
					// would wrap to a negative wait, a retry at once.
					spread = min(time.Duration(rand.Float64()*b.policy.Jitter/5*float64(ra)), math.MaxInt64-wait)
				}
			}
		}
	}
	if st := b.fits(now.Add(wait + spread)); st != nil {
		if spread == 0 || b.fits(now.Add(wait)) != nil {
			st.wait = wait
			return 0, st
		}
		spread = 0 // the spread is a nicety; the budget is not spent on it
	}
	return wait + spread, nil
}

// fits says why an attempt at the time at would be past the budget. It
// returns nil if the attempt fits.
func (b *budget) fits(at time.Time) *stop {
	if b.left != nil {
		window, send := b.left.lefts()
		switch wait := at.Sub(b.clock.Now()); {
		case wait >= window:
			return &stop{reason: stopExpired}
		case wait >= send:
			return &stop{reason: stopElapsed}
		}
	}
	switch {
	case !b.deadline.IsZero() && at.After(b.deadline):
		return &stop{reason: stopDeadline}
	case at.Sub(b.start) > b.policy.MaxElapsed:
		return &stop{reason: stopElapsed}
	}
	return nil
}

// attemptLimit returns how long an attempt that starts now may take. That is
// what is left of the budget on the clock. It also returns the part of the
// budget that ends the attempt first. The stored send deadline bounds it
// too, on a reading taken now. The budget's clock stops while the device
// sleeps, and a sleep may come after the last check (in a backoff wait or
// an Authorizer's refresh). So no attempt begins past the deadline.
func (b *budget) attemptLimit() (time.Duration, string) {
	now := b.clock.Now()
	limit, reason := b.start.Add(b.policy.MaxElapsed).Sub(now), stopElapsed
	if b.left != nil {
		l, send := b.left.lefts()
		if l < limit {
			limit, reason = l, stopExpired
		}
		if send < limit {
			limit, reason = send, stopElapsed
		}
	}
	if !b.deadline.IsZero() && b.deadline.Sub(now) < limit {
		limit, reason = b.deadline.Sub(now), stopDeadline
	}
	return limit, reason
}

func (b *budget) elapsed() time.Duration { return b.clock.Now().Sub(b.start) }
