// Package clock is the one notion of time in idem: the [Clock] interface
// that idem.New (idem.WithClock), the fakeserver and the idempotency
// middleware take, and [Manual], a clock for tests that moves only when
// told, so that backoff, Retry-After, leases and retention are tested
// without sleeping. Hand the same Manual to the client and to the fake
// server, and a client that "waits" two seconds makes two seconds pass for
// the server too.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock tells the time and waits. Everything that takes a Clock uses the
// system clock when it is nil. The server side only reads Now.
type Clock interface {
	Now() time.Time
	// Sleep waits for d, or until ctx is done and then returns ctx.Err().
	Sleep(ctx context.Context, d time.Duration) error
}

// Manual is a Clock that moves only when told: Sleep advances it instead of
// waiting. A Manual is safe for concurrent use.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

// NewManual returns a Manual clock set to start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the clock's current time.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
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
	}
	return nil
}

// Monotonic is what a Clock may also implement to tell elapsed time that no
// setting of the wall clock moves: the time since an arbitrary fixed
// instant, such as the start of the process. idem measures with it how long
// ago this process last sent an intent and how old the intents it created
// are. Without it, the differences of Now are used: the system clock's
// readings carry a monotonic reading within a process, so they are safe; a
// Clock whose Now can jump gives no such protection.
type Monotonic interface {
	Monotonic() time.Duration
}

// Sleeps returns the durations passed to Sleep so far, in order.
func (c *Manual) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}
