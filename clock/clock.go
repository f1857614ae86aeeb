// Package clock is the one notion of time in idem. It has the [Clock]
// interface, and [Manual], a clock for tests. idem.New (idem.Config.Clock),
// the fakeserver and the idempotency middleware take a Clock. A Manual moves
// only when told. So backoff, Retry-After, leases and retention are tested
// without sleeping. Hand the same Manual to the client and to the fake
// server. Then a client that "waits" two seconds makes two seconds pass for
// the server too.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock tells the time and waits. Everything that takes a Clock uses the
// system clock when it is nil. The server side only reads Now.
//
// A Clock may also have a method the client reads where it exists. It is
// Monotonic() time.Duration, as System's and Manual have. It gives elapsed
// time since a fixed instant. No setting of the wall clock moves it.
type Clock interface {
	Now() time.Time
	// Sleep waits for d, or until ctx is done and then returns ctx.Err().
	Sleep(ctx context.Context, d time.Duration) error
	// SinceBoot is the time since the device booted, counting the time it
	// slept. It comes with an identity of that boot. Two readings are
	// compared only when their boot identities are equal. ok is false where
	// the clock has no such reading. Then the client judges ages by the
	// other clocks alone. Device sleep within one process then counts only
	// on the wall clock. A Clock that has none embeds NoBoot.
	SinceBoot() (elapsed time.Duration, boot string, ok bool)
}

// NoBoot is embedded by a Clock that has no reading counting device sleep.
// (A server's clock is one.) Its SinceBoot says so.
type NoBoot struct{}

// SinceBoot reports ok false, for there is no reading.
func (NoBoot) SinceBoot() (time.Duration, string, bool) { return 0, "", false }

// Manual is a Clock that moves only when told. Sleep advances it instead of
// waiting. A Manual is safe for concurrent use.
//
// It has the system clock's three readings:
//
//   - the wall clock (Now);
//   - a monotonic clock (Monotonic) that no setting of the wall clock moves;
//   - a clock that counts device sleep (SinceBoot), under one boot identity.
//
// Advance and Sleep move all three. Advance with a negative duration sets
// the wall clock back, and moves nothing else. A user or a bad network time
// may set it back so.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	mono   time.Duration
	boot   time.Duration
	sleeps []time.Duration
}

// NewManual returns a Manual clock set to start.
func NewManual(start time.Time) *Manual { return &Manual{now: start, boot: time.Hour} }

// Monotonic is the clock's monotonic reading. It is how far Advance and
// Sleep moved it forward.
func (c *Manual) Monotonic() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// SinceBoot is the clock's reading of the time since the device booted. It
// is one hour at NewManual, under the boot identity "boot-1". ok is true.
func (c *Manual) SinceBoot() (elapsed time.Duration, boot string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boot, "boot-1", true
}

// Now returns the clock's current time.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves every reading of the clock forward by d. A negative d sets
// the wall clock back and moves nothing else.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	if d > 0 {
		c.mono += d
		c.boot += d
	}
}

// Sleep records d and advances the clock by it, returning at once. It
// returns ctx.Err() without advancing if ctx is already done.
func (c *Manual) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	if d > 0 {
		c.now = c.now.Add(d)
		c.mono += d
		c.boot += d
	}
	return nil
}

// Sleeps returns the durations passed to Sleep so far, in order.
func (c *Manual) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}
