package idem

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// monotonicClock is what a Clock may also implement to tell elapsed time. No
// setting of the wall clock moves that time. It is the time since an
// arbitrary fixed instant, such as the process's start. (The system clock
// and clock.Manual implement it.) idem measures with it how long ago this
// process last sent an intent. It measures how old the intents it created
// are too. Like Go's monotonic reading, it may stop while the device sleeps.
// So the clock that counts sleep (SinceBoot) is read as well, where the
// clock has one. Without monotonicClock, the differences of Now are used.
type monotonicClock interface {
	Monotonic() time.Duration
}

// clocks are the device's clocks as a Client reads them, to judge an
// intent's age.
//
//   - The injectable Clock gives wall time. Where it is a monotonicClock, it
//     gives the in-process timeline too.
//   - SinceBoot gives the time since boot, where it counts device sleep.
//   - The wall clock's high-water mark is kept too.
type clocks struct {
	clock clock.Clock
	// store holds the marks of earlier processes, read once (seedMark).
	store persist.Store

	// markMu guards wallMark, the wall clock's high-water mark.
	markMu   sync.Mutex
	wallMark time.Time
	seedMark sync.Once
	// birth is every clock's reading when the Client was made.
	birth reading
	// born is when the Client was made, on the clock's timeline. Where the
	// clock is a monotonicClock, it is on that timeline too.
	born     time.Time
	bornMono time.Duration
}

// newClocks reads clk when the Client is made.
func newClocks(clk clock.Clock, store persist.Store) *clocks {
	c := &clocks{clock: clk, store: store, born: clk.Now()}
	if m, ok := clk.(monotonicClock); ok {
		c.bornMono = m.Monotonic()
	}
	c.birth = c.read()
	return c
}

// reading is one reading of every clock the device has.
//
//   - sinceBirth is the in-process timeline.
//   - The wall clock is read without Go's monotonic reading.
//   - The time since boot, sleep included, is read where the clock has
//     SinceBoot.
type reading struct {
	in     time.Duration
	wall   time.Time
	boot   time.Duration
	bootID string // empty: no clock that counts sleep
}

func (c *clocks) read() reading {
	r := reading{in: c.sinceBirth(), wall: c.clock.Now().Round(0)}
	if d, id, ok := c.clock.SinceBoot(); ok {
		r.boot, r.bootID = d, id
	}
	return r
}

// leastSince returns the smallest time any clock says passed from r0 to r1.
// That is the safe reading for trusting that an attempt can no longer
// arrive.
func leastSince(r0, r1 reading) time.Duration {
	d := min(r1.in-r0.in, r1.wall.Sub(r0.wall))
	if r0.bootID != "" && r0.bootID == r1.bootID {
		d = min(d, r1.boot-r0.boot)
	}
	return d
}

// sinceBirth returns the time elapsed since the Client was made. It is on a
// timeline the wall clock cannot move (see monotonicClock).
func (c *clocks) sinceBirth() time.Duration {
	if m, ok := c.clock.(monotonicClock); ok {
		return m.Monotonic() - c.bornMono
	}
	return c.clock.Now().Sub(c.born)
}

// mark returns the wall clock's high-water mark. That is the latest wall
// time this Client has read or found in a record. It is never less than the
// wall time at birth plus the in-process time since. A clock set back cannot
// lower it.
func (c *clocks) mark(r reading) time.Time {
	c.seedMark.Do(func() {
		// A store keeps the unresolved intents at hand. The marks stored
		// with them say what an earlier process saw.
		recs, _ := c.store.List(context.Background(), persist.Filter{Unresolved: true})
		for _, rec := range recs {
			c.observe(rec)
		}
	})
	now := r.wall
	if floor := c.born.Round(0).Add(r.in); floor.After(now) {
		now = floor
	}
	c.markMu.Lock()
	defer c.markMu.Unlock()
	if now.After(c.wallMark) {
		c.wallMark = now
	}
	return c.wallMark
}

// observe raises the high-water mark to what rec says the wall clock has
// shown.
func (c *clocks) observe(rec *persist.Record) {
	if rec == nil || rec.Clocks == nil {
		return
	}
	c.markMu.Lock()
	defer c.markMu.Unlock()
	if rec.Clocks.Mark.After(c.wallMark) {
		c.wallMark = rec.Clocks.Mark
	}
}

// age returns how old the intent of rec is, as far as the device can tell.
// It is the largest age any clock reports. That is the safe reading for
// stopping before the server forgets the key. The clocks are these:
//
//   - The wall clock, without Go's monotonic reading, since the creation.
//     The age is never less than at the record's last write.
//   - The wall clock's high-water mark since the mark at arming. A clock set
//     back cannot lower it.
//   - The clock that counts device sleep since the arming, within one boot.
//   - The in-process timeline since this Client first saw the intent. (It
//     created the intent, or sent it after a restart.) The age the intent
//     had then is added.
//
// r is a reading of the clocks taken now (read). Its wall time is now.
func (c *clocks) age(rec *persist.Record, r reading, bornAt func(time.Duration) time.Duration) time.Duration {
	c.observe(rec)
	at := r.wall
	if rec.UpdatedAt.After(at) {
		at = rec.UpdatedAt
	}
	wall := at.Sub(rec.CreatedAt)
	armMark := rec.CreatedAt
	if rec.Clocks != nil && !rec.Clocks.ArmMark.IsZero() {
		armMark = rec.Clocks.ArmMark
	}
	age := max(wall, c.mark(r).Sub(armMark))
	if cl := rec.Clocks; cl != nil && cl.ArmBoot != "" && cl.ArmBoot == r.bootID {
		age = max(age, r.boot-cl.Armed)
	}
	born := bornAt(r.in - age)
	return max(age, r.in-born)
}

// resolvedAge returns the smallest age any clock reports for a resolved
// record's last write. That is the safe reading for deleting it. The clocks
// are the wall clock since UpdatedAt, and the clock that counts sleep. That
// clock counts since the last write, within one boot.
func (c *clocks) resolvedAge(rec *persist.Record, r reading) time.Duration {
	t := rec.UpdatedAt
	if t.IsZero() {
		t = rec.CreatedAt
	}
	age := r.wall.Sub(t)
	if cl := rec.Clocks; cl != nil && cl.WriteBoot != "" && cl.WriteBoot == r.bootID {
		age = min(age, r.boot-cl.Written)
	}
	return age
}
