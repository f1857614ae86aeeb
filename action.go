package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem/persist"
)

func (c *Client) intentOf(rec *persist.Record) *Intent { return &Intent{rec: rec, keys: c.keys} }

// newRecord makes the record of a new intent, with a fresh UUIDv4 key
// spelled on the wire as this Client spells keys. req has been validated;
// fp is its fingerprint, seq its place among its name's intents.
func (c *Client) newRecord(name string, req Request, fp string, seq uint64, now time.Time) (*persist.Record, error) {
	rec := new(persist.Record)
	return rec, c.makeRecord(rec, name, req, fp, seq, now)
}

// makeRecord is newRecord, made in rec: memory allocated with the
// Intent that holds it.
func (c *Client) makeRecord(rec *persist.Record, name string, req Request, fp string, seq uint64, now time.Time) error {
	id, err := uuid.NewRandom()
	if err != nil {
		return fmt.Errorf("idem: generating idempotency key: %w", err)
	}
	key := id.String()
	*rec = persist.Record{
		Version:     persist.FormatVersion,
		Key:         key,
		KeyHeader:   c.keyHeader(key),
		Seq:         seq,
		Name:        name,
		Method:      req.Method,
		URL:         req.URL,
		Header:      req.Header.Clone(),
		Body:        bytes.Clone(req.Body),
		Fingerprint: fp,
		CreatedAt:   now,
		UpdatedAt:   now,
		State:       persist.StateNew,
	}
	return nil
}

// latestOf returns the intent created last among recs, the intents of one
// name: the highest Seq, which no setting of the device's clock moves.
// Records without one (0) come first, ordered by creation time.
func latestOf(recs []*persist.Record) *persist.Record {
	latest := recs[0]
	for _, r := range recs[1:] {
		if r.Seq > latest.Seq || r.Seq == latest.Seq && !r.CreatedAt.Before(latest.CreatedAt) {
			latest = r
		}
	}
	return latest
}

// Intent returns the intent for the action name with request req, the first
// half of Send: call it directly to show the key, or to hold the intent
// between showing the Pay button and sending it with Do.
//
//   - No intent for name yet: a new one is made. It lives in this process's
//     memory only until the tap: the first Do (or Settle, HTTPRequest, or
//     a round trip through the RoundTripper) arms it, with the one durable
//     write before its first byte is sent. An intent never armed is never
//     sent by anything but a call the app makes for it in this process:
//     after a restart it is gone, with a key that was never used, and
//     Unresolved and SettleAll never see it. Intent for the same name and
//     request returns the same unarmed intent until then.
//   - The latest intent for name holds the same request: it is returned, in
//     whatever state it is; Do on it resumes it, or returns its stored
//     outcome without sending.
//   - The request changed (the cart changed) and the latest intent failed,
//     was rejected or is void: a new intent is made.
//   - The request changed and the latest intent succeeded: *ResolvedError
//     with the earlier answer, and nothing is made: the action is paid. A
//     deliberate second payment is NewIntent.
//   - The request changed and the latest intent was never sent (unarmed,
//     armed and provably never on the wire, or stored not sent: a call of
//     it ended with ErrNotSent, in this process or an earlier one): it
//     is dropped and replaced by a new one; Do on the dropped one returns
//     ErrIntentReplaced.
//   - The request changed and the latest intent may have reached the
//     server with an unknown outcome: *UnresolvedError, and
//     nothing is made. Starting a second payment silently is the one
//     thing this call never does.
//
// The store decides which intent is the action's latest when one is armed
// (see persist.Claim): of two Clients on one store whose unarmed intents
// for one action are armed at once, one wins, and the other's Do sends the
// winner instead if it holds the same request (its Key changes to the
// winner's), or refuses as Intent would.
//
// If the store fails to read the action's intents, or the drop of a
// replaced armed intent fails, the error is a *SaveError and nothing can be
// sent. If the store holds a record it cannot read (a *persist.CorruptError)
// that may be this action's (the file store tells a record's action from
// its file's name), Intent refuses with that error rather than guess, for
// it could be the action's unresolved intent: inspect the file it names,
// then quarantine or delete it. Damaged records of other actions do not
// stop it.
func (c *Client) Intent(ctx context.Context, name string, req Request) (*Intent, error) {
	if name == "" {
		return nil, errors.New("idem: Intent needs a name for the action; use NewIntent for a one-off")
	}
	return c.intent(ctx, name, req, false)
}

// NewIntent makes a new intent with a new key, even when the latest intent
// for name holds the same request, as when the user pays again after a
// declined card, or when the action succeeded and the user means to pay
// for it a second time. Like Intent's, it is armed, and saved, by its first
// Do. It still refuses, with *UnresolvedError, while the latest intent for
// name may have reached the server with an unknown outcome. An empty name
// makes a one-off intent that belongs to no action and is never refused.
func (c *Client) NewIntent(ctx context.Context, name string, req Request) (*Intent, error) {
	return c.intent(ctx, name, req, true)
}

func (c *Client) intent(ctx context.Context, name string, req Request, forceNew bool) (*Intent, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	// One action's intents are decided one at a time, so two goroutines
	// cannot both find "no intent" and make two.
	c.actionMu.Lock()
	defer c.actionMu.Unlock()

	fp := req.fingerprint()
	seq := uint64(1)
	// latest is the action's latest intent as stored, nil if none.
	var latest *persist.Record
	if name != "" {
		var err error
		if latest, err = c.latestIntent(ctx, name); err != nil {
			return nil, err
		}
		if latest != nil {
			seq = latest.Seq + 1
		}
		// This Client's unarmed intent for name, if the store has not
		// moved on since it was made: the action's latest, never sent.
		// The Seq alone cannot tell: a record deleted since (a replaced
		// intent) frees its Seq for another Client's next intent.
		if u := c.unarmed[name]; u != nil {
			delete(c.unarmed, name)
			if u.current().Seq == seq && u.after == revOf(latest) {
				if u.matches(req) && !forceNew {
					c.unarmed[name] = u
					return u, nil
				}
				u.replace()
			}
		}
		if latest != nil {
			same := latest.Fingerprint == fp
			switch {
			case same && !forceNew:
				return c.intentOf(latest), nil
			case latest.State == persist.StateSucceeded && !forceNew:
				return nil, &ResolvedError{Name: name, Previous: c.intentOf(latest)}
			case latest.State.Resolved():
				// Known outcome: a new intent cannot pay twice.
			case c.keys.replaceable(latest):
				if err := c.replace(ctx, name, latest); err != nil {
					return nil, err
				}
			default:
				return nil, &UnresolvedError{Name: name, Previous: c.intentOf(latest)}
			}
		}
	}
	// The Intent, its first record and room for its armed version, made
	// in one allocation.
	made := new(struct {
		in    Intent
		rec   persist.Record
		armed armedVersion
	})
	if err := c.makeRecord(&made.rec, name, req, fp, seq, c.clock.Now()); err != nil {
		return nil, err
	}
	in := &made.in
	in.rec, in.keys, in.unarmed, in.force, in.after = &made.rec, c.keys, true, forceNew, revOf(latest)
	in.armRoom = &made.armed
	if name != "" {
		if c.unarmed == nil {
			c.unarmed = make(map[string]*Intent)
		}
		c.unarmed[name] = in
	}
	return in, nil
}

// latestIntent returns the action's latest intent as stored, nil if none.
func (c *Client) latestIntent(ctx context.Context, name string) (*persist.Record, error) {
	recs, err := c.store.List(ctx, persist.Filter{Name: name})
	if err != nil {
		var corrupt *persist.CorruptError
		if errors.As(err, &corrupt) {
			// An unreadable record may be this action's unresolved
			// intent: refuse rather than guess.
			return nil, fmt.Errorf("idem: cannot tell whether an earlier intent for %q is unresolved: %w", name, err)
		}
		return nil, &SaveError{Op: "read the action's intents", Err: err}
	}
	if len(recs) == 0 {
		return nil, nil
	}
	return latestOf(recs), nil
}

// replace drops latest, the action's latest intent as stored, for a
// changed request: the table's evReplace, made while no call of its key
// runs in this Client, so none can begin sending it meanwhile. The store
// deletes it only if no other Client took it over to send it since it was
// read (persist.DeleteIf); only then is it dropped in memory.
func (c *Client) replace(ctx context.Context, name string, latest *persist.Record) error {
	var err error
	ran := c.flights.exclusive(latest.Key, func() {
		if !c.keys.replaceable(latest) {
			err = &UnresolvedError{Name: name, Previous: c.intentOf(latest)}
			return
		}
		if err = persist.DeleteIf(ctx, c.store, latest); err == nil {
			c.keys.saved.drop(latest.Key)
			c.keys.dropped(latest.Key)
		}
	})
	if !ran {
		// A call of it is sending it now.
		return &UnresolvedError{Name: name, Previous: c.intentOf(latest)}
	}
	var changed *persist.ConflictError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &changed):
		// Another Client took it over: it may be sending it.
		c.keys.forget(latest.Key)
		prev := latest
		if changed.Current != nil {
			prev = changed.Current
		}
		return &UnresolvedError{Name: name, Previous: c.intentOf(prev)}
	case errors.As(err, new(*UnresolvedError)):
		return err
	}
	return &SaveError{Key: latest.Key, Op: "drop unsent", Err: err}
}

// armedVersion is an intent's armed version, with room for its clock
// readings.
type armedVersion struct {
	rec    persist.Record
	clocks persist.Clocks
}

// arm makes an unarmed intent durable before its first byte is sent: the
// tap. The arming write is the one durable write before sending, and it
// claims the action's latest intent in the store (persist.Claim), so that
// two Clients on one store cannot both arm an intent for one action. When
// the claim loses to an intent another Client armed, in becomes that
// intent if it holds the same request (and was not made by NewIntent);
// otherwise arm refuses as Intent would, and nothing is sent.
func (c *Client) arm(ctx context.Context, in *Intent) error {
	in.armMu.Lock()
	defer in.armMu.Unlock()
	in.mu.Lock()
	cur, unarmed, replaced := in.rec, in.unarmed, in.replaced
	in.mu.Unlock()
	if replaced {
		return fmt.Errorf("%w; nothing was sent (key %s)", ErrIntentReplaced, cur.Key)
	}
	if !unarmed {
		return nil
	}
	c.actionMu.Lock()
	defer c.actionMu.Unlock()
	// Intent may have replaced it while this call waited for the lock.
	in.mu.Lock()
	replaced = in.replaced
	in.mu.Unlock()
	if replaced {
		return fmt.Errorf("%w; nothing was sent (key %s)", ErrIntentReplaced, cur.Key)
	}
	// The armed version and its clocks, in the room made with the Intent
	// (used once), or in one allocation.
	next := in.armRoom
	in.armRoom = nil
	if next == nil {
		next = new(armedVersion)
	}
	next.rec = *cur
	rec := &next.rec
	// The server's retention of the key starts no sooner than its first
	// attempt: the intent's age counts from the tap.
	now := c.clock.Now()
	rec.CreatedAt, rec.UpdatedAt = now, now
	// The arming write carries the clock readings the intent's age is
	// judged by.
	r := c.stamp(rec, &next.clocks, true)
	// It is the claim: it carries the latest time this Client's call may
	// begin a send, from which the reconcile delay counts.
	sendBy(&next.clocks, r, next.clocks.Mark, c.policyFor(ctx).MaxElapsed+sendSlack)
	// The arming write names this Client its holder: while the stored
	// record is this version, no other Client can have sent it.
	rec.Holder = c.id
	armed, adopted, err := c.claimAction(ctx, in, rec)
	if err != nil {
		return err
	}
	c.dropUnarmed(in)
	in.mu.Lock()
	in.rec, in.unarmed = armed, false
	in.mu.Unlock()
	if !adopted {
		c.keys.saved.saved(armed)
		c.keys.armed(armed.Key, c.clocks.sinceBirth())
	}
	return nil
}

// claimAction writes rec, in's armed version, as its action's latest
// intent (persist.Claim), at the next place in the action when another
// Client took rec's since in was shown. It returns the record in holds
// from then on, and adopted when that is the intent another Client armed
// for the same request first.
func (c *Client) claimAction(ctx context.Context, in *Intent, rec *persist.Record) (*persist.Record, bool, error) {
	shownAt := rec.Seq // the action's next intent when this one was shown
	for {
		rec.Rev = persist.NewRev()
		err := persist.Claim(ctx, c.store, rec)
		if err == nil {
			break
		}
		var lost *persist.ConflictError
		if !errors.As(err, &lost) || lost.Current == nil {
			// (A conflict without the action's latest record is a
			// faulty store's: nothing to decide on, nothing sent.)
			var corrupt *persist.CorruptError
			if errors.As(err, &corrupt) {
				return nil, false, fmt.Errorf("idem: cannot tell whether an earlier intent for %q is unresolved: %w", rec.Name, err)
			}
			// The write's result is unknown: it may have armed the
			// intent, which is never provably unsent from now on.
			c.keys.storeFailed(rec.Key)
			return nil, false, &SaveError{Key: rec.Key, Op: "arm", Err: err, mayHaveLanded: true}
		}
		latest := lost.Current
		switch {
		case latest.Key == rec.Key || latest.Fingerprint == rec.Fingerprint && !in.force:
			// Another Client armed this action's intent for the same
			// request first: this tap is that intent.
			return latest, true, nil
		case latest.State == persist.StateSucceeded && (!in.force || latest.Seq >= shownAt):
			// A NewIntent pays again only over the payment it was shown
			// after: one made and paid since it was shown paid for it.
			return nil, false, &ResolvedError{Name: rec.Name, Previous: c.intentOf(latest)}
		case !latest.State.Resolved():
			return nil, false, &UnresolvedError{Name: rec.Name, Previous: c.intentOf(latest)}
		}
		next := *rec
		next.Seq = latest.Seq + 1
		rec = &next
	}
	return rec, false, nil
}

// dropUnarmed forgets in as its action's unarmed intent. c.actionMu must
// be held.
func (c *Client) dropUnarmed(in *Intent) {
	if name := in.current().Name; c.unarmed[name] == in {
		delete(c.unarmed, name)
	}
}

// Load returns the intent stored under key, or an error matching
// persist.ErrNotFound.
func (c *Client) Load(ctx context.Context, key string) (*Intent, error) {
	rec, err := c.store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return c.intentOf(rec), nil
}

// Unresolved returns the intents whose outcome is not known yet, oldest
// first, for a "pending" screen; SettleAll settles them all. Expired intents
// are included. An intent stored not sent is not: its outcome is known,
// and only the user's tap sends it again (Intent, then Do).
// If some stored intents cannot be read, the readable ones are returned
// with an error that names each unreadable one: persist.CorruptErrors lists
// them all, where errors.As finds only the first.
func (c *Client) Unresolved(ctx context.Context) ([]*Intent, error) {
	recs, err := c.store.List(ctx, persist.Filter{Unresolved: true})
	out := make([]*Intent, 0, len(recs))
	for _, rec := range recs {
		if rec.State != persist.StateNotSent {
			out = append(out, c.intentOf(rec))
		}
	}
	return out, err
}

// Forget deletes an intent from the device; an unarmed one (see Intent) is
// dropped from memory, and Do on it returns ErrIntentReplaced. It is the
// deliberate unsafe path: if the intent reached the server, its effect stays (a payment stays
// made) and nothing on the device remembers it. Prefer Settle.
// It returns ErrInFlight while a Do or Reconcile for the intent runs in
// this Client. A call of another Client on the same store is not seen:
// Forget deletes the record all the same, while that Client's request may
// be on the wire; that Client saves the outcome again if its answer
// arrives, and otherwise nothing on the device remembers the key.
func (c *Client) Forget(ctx context.Context, in *Intent) error {
	in.mu.Lock()
	unarmed := in.unarmed
	if unarmed {
		// Never sent and never saved: dropping it is all there is.
		in.replaced = true
	}
	in.mu.Unlock()
	if unarmed {
		c.actionMu.Lock()
		c.dropUnarmed(in)
		c.actionMu.Unlock()
		return nil
	}
	key := in.Key()
	var err error
	if !c.flights.exclusive(key, func() {
		c.actionMu.Lock()
		defer c.actionMu.Unlock()
		c.keys.saved.drop(key)
		var cur *persist.Record
		if cur, err = c.store.Get(ctx, key); err == nil {
			err = c.store.Delete(ctx, cur)
		} else if errors.Is(err, persist.ErrNotFound) {
			err = nil
		}
		if err == nil {
			c.keys.forget(key)
		}
	}) {
		return fmt.Errorf("%w: %s", ErrInFlight, key)
	}
	return err
}

// revOf is rec's version, "" for no record.
func revOf(rec *persist.Record) string {
	if rec == nil {
		return ""
	}
	return rec.Rev
}
