package idem

import (
	"context"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// reading is one reading of every clock the device has: the in-process
// timeline (sinceBirth), the wall clock without Go's monotonic reading, and,
// where the clock has one (clock.Boot), the time since boot, sleep
// included.
type reading struct {
	in     time.Duration
	wall   time.Time
	boot   time.Duration
	bootID string // empty: no clock that counts sleep
}

func (c *Client) read() reading {
	r := reading{in: c.sinceBirth(), wall: c.clock.Now().Round(0)}
	if b, ok := c.clock.(clock.Boot); ok {
		if d, id, ok := b.SinceBoot(); ok {
			r.boot, r.bootID = d, id
		}
	}
	return r
}

// leastSince returns the smallest time any clock says passed from r0 to r1:
// the safe reading for trusting that an attempt can no longer arrive.
func leastSince(r0, r1 reading) time.Duration {
	d := min(r1.in-r0.in, r1.wall.Sub(r0.wall))
	if r0.bootID != "" && r0.bootID == r1.bootID {
		d = min(d, r1.boot-r0.boot)
	}
	return d
}

// sinceBirth returns the time elapsed since the Client was made, on a
// timeline the wall clock cannot move (see clock.Monotonic).
func (c *Client) sinceBirth() time.Duration {
	if m, ok := c.clock.(clock.Monotonic); ok {
		return m.Monotonic() - c.bornMono
	}
	return c.clock.Now().Sub(c.born)
}

// mark returns the wall clock's high-water mark: the latest wall time this
// Client has read or found in a record. A clock set back cannot lower it.
func (c *Client) mark(now time.Time) time.Time {
	c.seedMark.Do(func() {
		// The marks stored with the unresolved intents (which a store
		// keeps at hand) say what an earlier process saw.
		recs, _ := c.store.List(context.Background(), persist.Filter{Unresolved: true})
		for _, rec := range recs {
			c.observe(rec)
		}
	})
	now = now.Round(0)
	c.markMu.Lock()
	defer c.markMu.Unlock()
	if now.After(c.wallMark) {
		c.wallMark = now
	}
	return c.wallMark
}

// observe raises the high-water mark to what rec says the wall clock has
// shown.
func (c *Client) observe(rec *persist.Record) {
	if rec == nil || rec.Clocks == nil {
		return
	}
	c.markMu.Lock()
	defer c.markMu.Unlock()
	if rec.Clocks.Mark.After(c.wallMark) {
		c.wallMark = rec.Clocks.Mark
	}
}

// stamp stores the clock readings of a write of rec in rec; armed is set
// for the arming write.
func (c *Client) stamp(rec *persist.Record, armed bool) {
	r := c.read()
	cl := persist.Clocks{}
	if rec.Clocks != nil {
		cl = *rec.Clocks
	}
	cl.WriteBoot, cl.Written = r.bootID, r.boot
	cl.Mark = c.mark(r.wall)
	if armed {
		cl.ArmBoot, cl.Armed, cl.ArmMark = r.bootID, r.boot, cl.Mark
	}
	rec.Clocks = &cl
}

// sent records that a call of key has just put its last attempt on the
// wire, or failed to: no attempt of this Client's can start after it.
func (c *Client) sent(key string) {
	now := c.read()
	c.sentMu.Lock()
	defer c.sentMu.Unlock()
	c.lastSent[key] = now
}

// settled forgets what the Client tracks for a key whose outcome is known.
func (c *Client) settled(key string) {
	c.sentMu.Lock()
	defer c.sentMu.Unlock()
	delete(c.lastSent, key)
	delete(c.created, key)
	delete(c.handed, key)
}

// mayStillArrive returns how much longer an attempt of key may still reach
// the server, as far as the device can know, or zero when none can. It
// must be called while no call of key runs in this process.
//
// An attempt may arrive up to the reconcile delay after it was last
// written, and it was last written no later than:
//
//   - never, if this Client created the intent and no attempt of it was
//     made (or every attempt provably never reached the server);
//   - the end of this Client's last call of key, if it made one;
//   - otherwise, the Client's birth: only an earlier process can have sent
//     it, and that process had ended.
//
// The time since then is the smallest any clock reports (the in-process
// timeline, which stops while the device sleeps; the wall clock, which the
// user may set back; the clock that counts sleep): no clock can make the
// wait shorter. Nothing of it needs to be stored.
func (c *Client) mayStillArrive(key string) time.Duration {
	now := c.read()
	c.sentMu.Lock()
	defer c.sentMu.Unlock()
	if _, unsent := c.unsent[key]; unsent {
		return 0
	}
	last, ok := c.lastSent[key]
	if !ok {
		last = c.birth // the Client's birth
	}
	return max(c.reconcile-leastSince(last, now), 0)
}

// age returns how old the intent of rec is, as far as the device can tell:
// the largest age any clock reports, the safe reading for stopping before
// the server forgets the key.
//
//   - the wall clock, without Go's monotonic reading, since its creation,
//     and never less than at the record's last write;
//   - the wall clock's high-water mark since the mark at arming, which a
//     clock set back cannot lower;
//   - the clock that counts device sleep since the arming, within one boot;
//   - the in-process timeline since this Client first saw the intent
//     (created it, or sent it after a restart), plus the age it had then.
func (c *Client) age(rec *persist.Record, now time.Time) time.Duration {
	c.observe(rec)
	r := c.read()
	at := now.Round(0)
	if rec.UpdatedAt.After(at) {
		at = rec.UpdatedAt
	}
	wall := at.Sub(rec.CreatedAt)
	armMark := rec.CreatedAt
	if rec.Clocks != nil && !rec.Clocks.ArmMark.IsZero() {
		armMark = rec.Clocks.ArmMark
	}
	age := max(wall, c.mark(r.wall).Sub(armMark))
	if cl := rec.Clocks; cl != nil && cl.ArmBoot != "" && cl.ArmBoot == r.bootID {
		age = max(age, r.boot-cl.Armed)
	}
	c.sentMu.Lock()
	born, ok := c.created[rec.Key]
	if !ok {
		born = r.in - age
		c.created[rec.Key] = born
	}
	c.sentMu.Unlock()
	return max(age, r.in-born)
}

// resolvedAge returns the smallest age any clock reports for the last
// write of a resolved record, the safe reading for deleting it: the wall
// clock since its UpdatedAt, and the clock that counts sleep since its
// last write, within one boot.
func (c *Client) resolvedAge(rec *persist.Record, r reading) time.Duration {
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
