package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/persist"
)

// handOut arms in and stores it as handed out before HTTPRequest gives
// the app its exact request (the table's evHandOut). An intent too old to
// send is refused, resolved or not. From then on the app
// may send it at any time, through any client. So it is never provably
// unsent again, a changed cart never replaces it, and no lookup's "not
// found" is trusted until the app reports that its send ended
// (SendEnded), or the server's retention has passed. A succeeded intent is
// handed out as it is: the server replays its answer. Any other resolved
// intent is refused: the server may hold no record of its key.
func (c *Client) handOut(ctx context.Context, in *Intent) error {
	if err := c.arm(ctx, in); err != nil {
		return err
	}
	key := in.Key()
	var err error
	if !c.flights.exclusive(key, func() { err = c.markHandedOut(ctx, in) }) {
		return fmt.Errorf("%w: %s; ask for its request when the call returns", ErrInFlight, key)
	}
	return err
}

func (c *Client) markHandedOut(ctx context.Context, in *Intent) error {
	cur, err := c.store.Get(ctx, in.Key())
	if err != nil {
		// The intent is armed: a later Do or SettleAll may send it.
		return fmt.Errorf("idem: loading intent %s: nothing was handed out, but the intent is armed, and a later Do or SettleAll may send it: %w: %w", in.Key(), ErrOutcomeUnknown, err)
	}
	in.set(cur)
	// An intent too old to send is not handed out, resolved or not: the
	// server may have forgotten its key, and would do its work anew.
	if cur.State == persist.StateExpired || cur.State != persist.StateNotSent && c.left(cur) <= 0 {
		if cur.State.Resolved() {
			return fmt.Errorf("idem: intent %s is %s and too old to send again: the server may no longer hold its key; nothing was handed out", cur.Key, cur.State)
		}
		rec := *cur
		if _, err := c.adopted(c.recordExpiry(ctx, in, &rec)); err != nil {
			return err
		}
		return fmt.Errorf("idem: intent %s was resolved meanwhile, and is too old to send again; nothing was handed out", cur.Key)
	}
	// Only a paid intent's request is answered from the server's record
	// of its key. A void intent's key the server never held, and a
	// failed or rejected one's it may not have kept (a refusal it does
	// not store, a gateway's answer): sent, the request would do the
	// work anew, and the device would still say it was not done.
	if cur.State.Resolved() && cur.State != persist.StateSucceeded {
		return fmt.Errorf("idem: intent %s is %s: the server may hold no record of its key, so its request, sent, would do the work anew; nothing was handed out; create a new intent (NewIntent) to do the action again", cur.Key, cur.State)
	}
	if cur.State.Resolved() {
		return nil
	}
	if !c.keys.handOut(cur) {
		return fmt.Errorf("%w; nothing was handed out (key %s)", ErrIntentReplaced, cur.Key)
	}
	rec := *cur
	rec.HandedOut = true
	rec.State = persist.StatePending
	rec.UpdatedAt = c.clock.Now()
	if cur.State == persist.StateNotSent {
		// Never sent: its age, and the server's retention of its key,
		// count from now.
		c.bornAgain(&rec)
	}
	// The app may send the request at any time: the hand-out claims the
	// record up to the server's retention from now (each hand-out anew),
	// and another Client's lookup waits for it (mayStillArrive).
	c.claim(&rec, c.retention, false)
	if err := c.saveIf(ctx, in, &rec, cur, "hand out"); err != nil {
		// Not handed out: the app gets no request. The write's result is
		// unknown; the record may say handed out, which only delays a
		// lookup's "not found".
		var changed *persist.ConflictError
		if errors.As(err, &changed) {
			c.keys.forget(cur.Key)
		}
		// But the intent is armed, or may be (the write may have
		// landed): a later Do or SettleAll may send it. So the app is
		// not told it was not sent.
		return fmt.Errorf("idem: intent %s: nothing was handed out, but the intent is armed, and a later Do or SettleAll may send it: %w: %w", cur.Key, ErrOutcomeUnknown, err)
	}
	return nil
}

// SendEnded tells the Client that the app's send of the request
// HTTPRequest handed out for in has ended, whatever came of it (an answer,
// an error, a cancel): nothing of it is still on its way once the
// reconcile delay (Server.ReconcileDelay) has passed from now, so a
// lookup's "not found" may then be trusted. Until the app calls it, the
// intent is reconciled as if its request were still in transit, up to the
// server's retention. An intent never handed out is left as it is.
func (c *Client) SendEnded(ctx context.Context, in *Intent) error {
	if in == nil {
		return errors.New("idem: SendEnded with a nil intent")
	}
	key := in.Key()
	var err error
	if !c.flights.exclusive(key, func() {
		var cur *persist.Record
		if cur, err = c.store.Get(ctx, key); err != nil {
			return
		}
		in.set(cur)
		if !cur.HandedOut {
			return
		}
		rec := *cur
		rec.HandedOut = false
		rec.UpdatedAt = c.clock.Now()
		// The app's send began no later than now: the hand-out's claim
		// ends here, for every Client's lookup. Another Client's claim,
		// if it took the intent over since, stands.
		now := c.claim(&rec, 0, cur.Holder == c.id)
		if err = c.saveIf(detached(ctx), in, &rec, cur, "send ended"); err == nil {
			c.keys.sendEnded(key, now)
		}
	}) {
		return fmt.Errorf("%w: %s", ErrInFlight, key)
	}
	return err
}
