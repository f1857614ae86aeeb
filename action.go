package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/idemkit/idem/persist"
)

func (c *Client) intentOf(rec *persist.Record) *Intent { return &Intent{rec: rec, unsent: c.keys} }

// newRecord makes the record of a new intent with a fresh UUIDv4 key. The
// key is spelled on the wire as this Client spells keys. req has been
// validated, and fp is its fingerprint. seq is the intent's place among its
// name's intents.
func (c *Client) newRecord(name string, req Request, fp string, seq uint64, now time.Time) (*persist.Record, error) {
	rec := new(persist.Record)
	return rec, c.makeRecord(rec, name, req, fp, seq, now)
}

// makeRecord is newRecord, made in rec. That lets the record share the
// allocation of its Intent.
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

// latestOf returns the intent created last among recs, one name's intents.
// That is the highest Seq, which no setting of the device's clock moves.
// Records without a Seq (0) come first, ordered by creation time.
func latestOf(recs []*persist.Record) *persist.Record {
	latest := recs[0]
	for _, r := range recs[1:] {
		if r.Seq > latest.Seq || r.Seq == latest.Seq && !r.CreatedAt.Before(latest.CreatedAt) {
			latest = r
		}
	}
	return latest
}

// Intent returns the intent for the action name with request req. It is the
// first half of Send. Call it directly to show the key. Or call it to hold
// the intent from the Pay button until Do sends it.
//
//   - No intent for name yet: a new one is made. It lives only in this
//     process's memory until the tap. The first Do arms it, and so do
//     Settle, HTTPRequest and the RoundTripper. Arming is the one durable
//     write before the first byte is sent. Only a call the app makes in this
//     process sends an unarmed intent. After a restart it is gone, and its
//     key was never used. Unresolved and SettleAll never see it. Until it is
//     armed, Intent for the same name and request returns it.
//   - The latest intent for name holds the same request: it is returned. It
//     may be in any state. Do on it resumes it, or returns its stored
//     outcome without sending.
//   - The request changed and the latest intent is failed, rejected or void.
//     A new intent is made.
//   - The request changed and the latest intent succeeded: nothing is made.
//     The action is paid. The error is *ResolvedError with the earlier
//     answer. A deliberate second payment is NewIntent.
//   - The request changed and the latest intent was never sent. It is
//     dropped and replaced by a new one. Never sent means unarmed, armed but
//     provably never on the wire, or stored not sent. Stored not sent means
//     a call of it ended with ErrNotSent, in any process. Do on the dropped
//     intent returns ErrIntentReplaced.
//   - The request changed and the latest intent may have reached the server.
//     The error is *UnresolvedError, and nothing is made. This call never
//     starts a second payment silently.
//
// The store decides which intent is the action's latest when one is armed.
// (See persist.Claim.) Two Clients on one store may arm intents for one
// action at once. One of them wins. The other's Do sends the winner instead
// if it holds the same request. Its Key then changes to the winner's.
// Otherwise the other's Do refuses as Intent would.
//
// The error is a *SaveError if the store fails to read the action's intents.
// It is one too if the drop of a replaced armed intent fails. Nothing can be
// sent then.
//
// The store may hold a record it cannot read, a *persist.CorruptError. If
// that record may be this action's, Intent refuses with that error. It could
// be the action's unresolved intent, and Intent does not guess. (The file
// store tells a record's action by its file's name.) Inspect the file the
// error names, then quarantine or delete it. Damaged records of other
// actions do not stop Intent.
func (c *Client) Intent(ctx context.Context, name string, req Request) (*Intent, error) {
	if name == "" {
		return nil, errors.New("idem: Intent needs a name for the action; use NewIntent for a one-off")
	}
	return c.intent(ctx, name, req, false)
}

// NewIntent makes a new intent with a new key. It does so even when the
// latest intent for name holds the same request. Use it when the user pays
// again after a declined card. Use it too when the action succeeded and the
// user means to pay again. Like Intent's, the intent is armed, and saved, by
// its first Do. NewIntent still refuses, with *UnresolvedError, in one case.
// That is while the action's latest intent may have reached the server. An
// empty name makes a one-off intent. A one-off belongs to no action and is
// never refused.
func (c *Client) NewIntent(ctx context.Context, name string, req Request) (*Intent, error) {
	return c.intent(ctx, name, req, true)
}

// madeBy says where an Intent comes from, for the calls' refusals.
const madeBy = "get one from Client.Intent, Client.NewIntent or Client.Load"

// checkNewIntent refuses what an intent may not be made of: a request
// that could never be sent, a key field of the app's, or an action name
// the store would change.
func checkNewIntent(name string, req Request) error {
	if err := req.validate(); err != nil {
		return err
	}
	if err := checkOwnKey(req.Header); err != nil {
		return err
	}
	// The store keeps text as JSON, which would change other bytes.
	if !utf8.ValidString(name) {
		return fmt.Errorf("idem: action name %q is not valid UTF-8; give it in UTF-8 (convert Latin-1 input, or percent-encode its bytes)", name)
	}
	return nil
}

func (c *Client) intent(ctx context.Context, name string, req Request, forceNew bool) (*Intent, error) {
	if err := checkNewIntent(name, req); err != nil {
		return nil, err
	}
	// One action's intents are decided one at a time. So two goroutines
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
		// This Client's unarmed intent for name is the action's latest,
		// never sent. That holds only if the store has not moved on since it
		// was made. The Seq alone cannot tell. A record deleted since, such
		// as a replaced intent, frees its Seq. Another Client's next intent
		// may then take that Seq.
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
	// The Intent, its first record and room for its armed version share one
	// allocation.
	made := new(struct {
		in    Intent
		rec   persist.Record
		armed armedVersion
	})
	if err := c.makeRecord(&made.rec, name, req, fp, seq, c.clock.Now()); err != nil {
		return nil, err
	}
	in := &made.in
	in.rec, in.unsent, in.unarmed, in.force, in.after = &made.rec, c.keys, true, forceNew, revOf(latest)
	if latest != nil && latest.State == persist.StateVoid {
		in.overVoid = latest.Key
	}
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
			// An unreadable record may be this action's unresolved intent.
			// Refuse rather than guess.
			return nil, fmt.Errorf("idem: cannot tell whether an earlier intent for %q is unresolved: %w", name, err)
		}
		return nil, &SaveError{Op: "read the action's intents", Err: err}
	}
	if len(recs) == 0 {
		return nil, nil
	}
	return latestOf(recs), nil
}

// replace drops latest, the action's stored latest intent, for a changed
// request. It is the table's evReplace. It runs while no call of its key
// runs in this Client. So no call can begin sending it meanwhile. The store
// deletes it only if no other Client took it over since it was read. (See
// persist.DeleteIf.) Only then is it dropped in memory.
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
		// Another Client took it over, and it may be sending it.
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

// arm makes an unarmed intent durable before its first byte is sent. That is
// the tap. The arming write is the one durable write before sending. It
// claims the action's latest intent in the store (persist.Claim). So two
// Clients on one store cannot both arm an intent for one action. The claim
// may lose to an intent another Client armed. Then in becomes that intent if
// it holds the same request. (An intent made by NewIntent never does.)
// Otherwise arm refuses as Intent would, and nothing is sent.
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
	// The armed version and its clocks go in the room made with the Intent.
	// That room is used once; after it, they take one allocation.
	next := in.armRoom
	in.armRoom = nil
	if next == nil {
		next = new(armedVersion)
	}
	next.rec = *cur
	rec := &next.rec
	// The server keeps the key from no sooner than its first attempt. So the
	// intent's age counts from the tap.
	now := c.clock.Now()
	rec.CreatedAt, rec.UpdatedAt = now, now
	// The arming write carries the clock readings that judge the intent's
	// age.
	r := c.stamp(rec, &next.clocks, true)
	// It is the claim. It carries the latest time this Client's call may
	// begin a send. The reconcile delay counts from that time.
	sendBy(&next.clocks, r, next.clocks.Mark, c.policyFor(ctx).MaxElapsed+sendSlack)
	// The arming write names this Client its holder. While the stored record
	// is this version, no other Client can have sent it.
	rec.Holder = c.id
	if err := c.stillVoid(ctx, in.overVoid, rec.Name); err != nil {
		return err
	}
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

// stillVoid refuses to arm an intent made over the void stored with key,
// once that void was written over. A void is the one resolved record that
// may change: the server's word that the work was done may be written over
// it (arbitrate, recordLookup). The action is then paid, or its outcome is
// unknown. Nothing is sent, and the error says which. key "" checks nothing.
func (c *Client) stillVoid(ctx context.Context, key, name string) error {
	if key == "" {
		return nil
	}
	stored, err := c.store.Get(ctx, key)
	switch {
	case errors.Is(err, persist.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("idem: cannot tell whether the earlier intent for %q is still void; nothing was sent: %w", name, err)
	case stored.State == persist.StateSucceeded:
		return &ResolvedError{Name: name, Previous: c.intentOf(stored)}
	case !stored.State.Resolved():
		return &UnresolvedError{Name: name, Previous: c.intentOf(stored)}
	}
	return nil
}

// claimAction writes rec, in's armed version, as its action's latest intent.
// (See persist.Claim.) Another Client may have taken rec's place since in
// was shown. Then rec goes to the next place in the action. claimAction
// returns the record in holds from then on. adopted reports that this is
// another Client's intent for the same request. That Client armed it first.
func (c *Client) claimAction(ctx context.Context, in *Intent, rec *persist.Record) (*persist.Record, bool, error) {
	shownAt := rec.Seq // the action's next intent when in was shown
	for {
		rec.Rev = c.revs.next()
		err := persist.Claim(ctx, c.store, rec)
		if err == nil {
			break
		}
		var lost *persist.ConflictError
		if !errors.As(err, &lost) || lost.Current == nil {
			// A conflict without the action's latest record comes from a
			// faulty store. There is nothing to decide on, and nothing was
			// sent.
			var corrupt *persist.CorruptError
			if errors.As(err, &corrupt) {
				return nil, false, fmt.Errorf("idem: cannot tell whether an earlier intent for %q is unresolved: %w", rec.Name, err)
			}
			// The write's result is unknown, and it may have armed the
			// intent. From now on the intent is never provably unsent.
			c.keys.storeFailed(rec.Key)
			return nil, false, &SaveError{Key: rec.Key, Op: "arm", Err: err, mayHaveLanded: true}
		}
		latest := lost.Current
		switch {
		case latest.Key == rec.Key || latest.Fingerprint == rec.Fingerprint && !in.force:
			// Another Client armed this action's intent for the same request
			// first. This tap is that intent.
			return latest, true, nil
		case latest.State == persist.StateSucceeded && (!in.force || latest.Seq >= shownAt):
			// A NewIntent pays again only over the payment it was shown
			// after. One made and paid since it was shown paid for it.
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

// dropUnarmed forgets in as its action's unarmed intent. c.actionMu must be
// held.
func (c *Client) dropUnarmed(in *Intent) {
	if name := in.current().Name; c.unarmed[name] == in {
		delete(c.unarmed, name)
	}
}

// Load returns the intent stored under key. If there is none, the error
// matches persist.ErrNotFound. A void this Client knows the server
// overruled is written over first (see Reconcile). If the store refuses,
// the error matches ErrOutcomeUnknown, and no void is returned.
func (c *Client) Load(ctx context.Context, key string) (*Intent, error) {
	rec, err := c.store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return c.intentOf(rec), nil
}

// Unresolved returns the intents whose outcome is not known yet. They come
// oldest first, for a "pending" screen. SettleAll settles them all. Expired
// intents are included. An intent stored not sent is not included, for its
// outcome is known. Only the user's tap sends it again (Intent, then Do).
// Some stored intents may be unreadable. Then the readable ones are returned
// with an error that names each unreadable one. persist.CorruptErrors lists
// them all; errors.As finds only the first.
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

// Forget deletes an intent from the device. An unarmed intent (see Intent)
// is dropped from memory. Do on it then returns ErrIntentReplaced. Forget is
// the deliberate unsafe path; prefer Settle. If the intent reached the
// server, its effect stays. A payment stays made, and nothing on the device
// remembers it.
//
// Forget returns ErrInFlight while a Do or Reconcile of the intent runs in
// this Client. It does not see a call of another Client on the same store.
// It deletes the record all the same, while that request may be on the wire.
// If that call's answer arrives, that Client saves the outcome again.
// Otherwise nothing on the device remembers the key.
func (c *Client) Forget(ctx context.Context, in *Intent) error {
	if !in.made() {
		return errors.New("idem: Forget with a nil or zero intent: " + madeBy)
	}
	in.mu.Lock()
	unarmed := in.unarmed
	if unarmed {
		// Never sent and never saved, so dropping it is all there is.
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
