package idem

import (
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// sinceBirth returns the time elapsed since the Client was made, on a
// timeline the wall clock cannot move (see clock.Monotonic).
func (c *Client) sinceBirth() time.Duration {
	if m, ok := c.clock.(clock.Monotonic); ok {
		return m.Monotonic() - c.bornMono
	}
	return c.clock.Now().Sub(c.born)
}

// sent records that a call of key has just put its last attempt on the
// wire, or failed to: no attempt of this Client's can start after it.
func (c *Client) sent(key string) {
	now := c.sinceBirth()
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
// All three are measured on the in-process timeline, so no setting of the
// wall clock shortens the wait; nothing of it needs to be stored.
func (c *Client) mayStillArrive(key string) time.Duration {
	now := c.sinceBirth()
	c.sentMu.Lock()
	defer c.sentMu.Unlock()
	if _, unsent := c.unsent[key]; unsent {
		return 0
	}
	last, ok := c.lastSent[key]
	if !ok {
		last = 0 // the Client's birth
	}
	return max(c.reconcile-(now-last), 0)
}

// age returns how old the intent of rec is, as far as the device can tell.
// The wall clock's reading is all there is for the time before this Client
// first saw the intent (created it, or sent it after a restart); from then
// on, the in-process timeline keeps counting whatever the wall clock does,
// so a clock set back while the app runs cannot make an intent younger.
// And the age is never less than at the record's last write.
func (c *Client) age(rec *persist.Record, now time.Time) time.Duration {
	at := now
	if rec.UpdatedAt.After(at) {
		at = rec.UpdatedAt
	}
	wall := at.Sub(rec.CreatedAt)
	in := c.sinceBirth()
	c.sentMu.Lock()
	born, ok := c.created[rec.Key]
	if !ok {
		born = in - wall
		c.created[rec.Key] = born
	}
	c.sentMu.Unlock()
	return max(wall, in-born)
}

// expiry returns the instant, on the clock's timeline from now, when rec
// may no longer be sent: once its age reaches the retention less the
// margin.
func (c *Client) expiry(rec *persist.Record, now time.Time) time.Time {
	return now.Add(c.retention - c.margin - c.age(rec, now))
}
