package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/persist"
)

// handOut arms in and stores it as handed out. It does so before HTTPRequest
// gives the app its exact request. (It is the table's evHandOut.) From then
// on the app may send it at any time, through any client. So it is never
// provably unsent again, and a changed cart never replaces it. A lookup's
// "not found" is not trusted until the app reports that its send ended
// (SendEnded). Once the server's retention has passed, it is trusted too.
//
// An intent too old to send is refused, resolved or not. A succeeded intent
// is handed out as it is, for the server replays its answer. Any other
// resolved intent is refused. The server may hold no record of its key.
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
		// The intent is armed, so a later Do or SettleAll may send it.
		return fmt.Errorf("idem: loading intent %s: nothing was handed out, but the intent is armed, and a later Do or SettleAll may send it: %w: %w", in.Key(), ErrOutcomeUnknown, err)
	}
	in.set(cur)
	// An intent too old to send is not handed out, resolved or not. The
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
	// Only a paid intent's request is answered from the server's record of
	// its key. The server never held a void intent's key. It may not have
	// kept a failed or rejected one's. (It may not store a refusal, and a
	// gateway's answer is not its own.) Sent, the request would do the work
	// anew. And the device would still say it was not done.
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
		// It was never sent. Its age, and the server's retention of its key,
		// count from now.
		c.bornAgain(&rec)
	}
	// The app may send the request at any time. The hand-out claims the
	// record up to the server's retention from now. Each hand-out claims it
	// anew. Another Client's lookup waits for it (mayStillArrive).
	c.claim(&rec, c.retention, false)
	if err := c.saveIf(ctx, in, &rec, cur, "hand out"); err != nil {
		// It is not handed out, so the app gets no request. The write's
		// result is unknown. The record may say handed out, which only
		// delays a lookup's "not found".
		var changed *persist.ConflictError
		if errors.As(err, &changed) {
			c.keys.forget(cur.Key)
		}
		// But the intent is armed, or may be, for the write may have landed.
		// A later Do or SettleAll may send it. So the app is not told it was
		// not sent.
		return fmt.Errorf("idem: intent %s: nothing was handed out, but the intent is armed, and a later Do or SettleAll may send it: %w: %w", cur.Key, ErrOutcomeUnknown, err)
	}
	return nil
}

// SendEnded tells the Client that the app's send has ended. That is the send
// of the request HTTPRequest handed out for in. Call it whatever came of the
// send: an answer, an error, a cancel. Once the reconcile delay
// (Server.ReconcileDelay) has passed from now, nothing of it is still on its
// way. A lookup's "not found" may then be trusted. Until the app calls it,
// the intent is reconciled as if its request were in transit. That lasts up
// to the server's retention. An intent never handed out is left as it is.
func (c *Client) SendEnded(ctx context.Context, in *Intent) error {
	if !in.made() {
		return errors.New("idem: SendEnded with a nil or zero intent: " + madeBy)
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
		// The app's send began no later than now. So the hand-out's claim
		// ends here, for every Client's lookup. Another Client may have
		// taken the intent over since. Its claim stands.
		now := c.claim(&rec, 0, cur.Holder == c.id)
		if err = c.saveIf(detached(ctx), in, &rec, cur, "send ended"); err == nil {
			c.keys.sendEnded(key, now)
		}
	}) {
		return fmt.Errorf("%w: %s", ErrInFlight, key)
	}
	return err
}
