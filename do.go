package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem/persist"
)

// Do sends the intent and returns its final answer. An answer whose save
// on the device failed is returned all the same, with NotRecorded set and
// a *SaveError (Op "record outcome"): the payment it reports happened.
//
// An intent made by Intent or NewIntent is armed by its first Do: saved
// durably, in the one write before its first byte is sent. If that write
// fails (a *SaveError) nothing is sent; the error matches
// ErrOutcomeUnknown, since the write may have landed.
//
// A resolved intent is not sent: Do returns the stored answer with
// FromStore set. An unresolved one is sent with its key and exact bytes,
// and retried under the Client's RetryPolicy. A 2xx answer returns the
// Response and a nil error. Any other final answer (a declined card, a
// 422) returns the Response and an *APIError; it is stored and never
// retried. When no final answer arrives, Do returns a *RetryError matching
// ErrOutcomeUnknown and the intent stays unresolved: Do it again later.
//
// A Do that cannot read the intent's record from the store (its context
// ended, the store failed) sends nothing and returns the store's error
// (the context's): it also matches ErrOutcomeUnknown unless the intent
// was stored not sent, since an earlier attempt may have reached the
// server.
func (c *Client) Do(ctx context.Context, in *Intent) (*Response, error) {
	if in == nil {
		return nil, errors.New("idem: Do with a nil intent")
	}
	if err := checkPolicy(ctx); err != nil {
		return nil, err
	}
	// The tap: an unarmed intent is made durable before its first byte.
	if err := c.arm(ctx, in); err != nil {
		return nil, err
	}
	ask := callAsk{tick: c.keys.callTick()}
	resp, err := c.flights.do(ctx, in.Key(), func() (*Response, error) { return c.doAs(ctx, in, c.retry, nil, ask) })
	return resp, forCall(err, callDo)
}

// callAsk is who asks a call to send: the app (Do, Settle, Send, the
// RoundTripper), or SettleAll (background), which never sends what the
// app was told was not sent. tick is when the app asked (keys.callTick):
// a call asked for before the intent ended not sent is not the app asking
// for it again.
type callAsk struct {
	background bool
	tick       uint64
}

// do is doAs for a call the app asks for now.
func (c *Client) do(ctx context.Context, in *Intent, r *retrier, header http.Header) (*Response, error) {
	return c.doAs(ctx, in, r, header, callAsk{tick: c.keys.callTick()})
}

// doAs runs one call for in through r. header, if not nil, replaces the
// stored headers (the RoundTripper sends the live request's). Its steps:
// read the record's current version, refuse what may not be sent (too old,
// unsendable), hold the record for this Client, send, and record what came
// of it: not sent, unknown, or the final answer.
func (c *Client) doAs(ctx context.Context, in *Intent, r *retrier, header http.Header, ask callAsk) (*Response, error) {
	cur, known, err := c.currentVersion(ctx, in)
	if err != nil {
		return nil, err
	}
	if cur.State.Resolved() {
		return c.storedOutcome(cur)
	}
	// rec is this call's next version of the record.
	next := *cur
	rec := &next
	if in.ephemeral {
		// Used for this one call: nothing to remember about it.
		defer c.keys.forget(rec.Key)
	}
	// How long the intent may still be sent, by the largest age any clock
	// reports, read again before every attempt and wait (intentLeft). The
	// age counts from the first moment a send could have begun: an intent
	// stored not sent was never on the wire, and its age starts again
	// when it is sent again (see hold).
	if rec.State != persist.StateNotSent && c.left(rec) <= 0 {
		return c.adopted(c.recordExpiry(ctx, in, rec))
	}
	if err := c.sendable(rec, known && cur.State != persist.StateExpired); err != nil {
		return nil, err
	}
	// A per-request key of the RoundTripper's is new with this call; a key
	// the caller chose may have been sent by its own earlier retry.
	if in.ephemeral && rec.Attempts == 0 && !in.callersKey {
		c.keys.armed(rec.Key, c.clocks.sinceBirth())
	}
	// The table decides, at the moment of sending, from the version just
	// read: whether it may be sent, and whether it is provably unsent.
	unsent, err := c.keys.begin(rec, ask.background, ask.tick)
	if err != nil {
		return nil, err
	}
	if !in.ephemeral && (rec.State == persist.StateNotSent || rec.Holder != c.id) {
		held, stillUnsent, moved, err := c.hold(ctx, in, rec, cur, unsent)
		if moved {
			// Another Client moved it on since it was read: go on from
			// what is stored.
			c.keys.forget(rec.Key)
			return c.doAs(ctx, in, r, header, ask)
		}
		if err != nil {
			return nil, err
		}
		rec, unsent = held, stillUnsent
	}

	if header == nil {
		header = rec.Header
	}
	resp, retryErr := c.newCall(ctx, rec, header, unsent).run(ctx, r)
	if retryErr != nil {
		return c.adopted(c.recordNoAnswer(ctx, in, rec, retryErr))
	}
	return c.recordAnswer(ctx, in, rec, resp)
}

// currentVersion returns the version of in's record to send from, and
// whether it is the version this Client saved last.
func (c *Client) currentVersion(ctx context.Context, in *Intent) (cur *persist.Record, known bool, err error) {
	cur = in.current()
	// Intent deleted a replaced intent from the store: say so, rather
	// than that the store has no such intent.
	if err := c.keys.notReplaced(cur.Key); err != nil {
		return nil, false, err
	}
	// The store is the truth: another Intent value for this key, another
	// Client on the store, or an earlier process, may have moved an
	// unresolved intent on. A resolved one never changes, and one that
	// holds the version this Client saved last is current: neither needs
	// the read. But a version that reads provably unsent is trusted only
	// by the call that follows its arming: another Client may have taken
	// it over and sent it since (not sent: always read).
	switch cur.State {
	case persist.StateNew:
		known = c.keys.saved.took(cur)
	case persist.StateNotSent:
		known = false
	default:
		known = c.keys.saved.is(cur)
	}
	if !in.ephemeral && !cur.State.Resolved() && !known {
		stored, err := c.store.Get(ctx, cur.Key)
		if err != nil {
			return nil, false, unread(cur, err)
		}
		in.set(stored)
		return stored, false, nil
	}
	return cur, known, nil
}

// unread is the error of a call that could not read in's record, cur its
// version that in holds, and sent nothing: err, the store's (the
// context's error when it ended), which also matches ErrOutcomeUnknown
// when cur says an earlier attempt may have reached the server (any
// unresolved state but StateNotSent: an armed intent may have been sent
// by a process that died before it recorded the attempt). A record
// stored not sent does not claim an outcome unknown, nor ErrNotSent: the
// store, unread, may no longer say so.
func unread(cur *persist.Record, err error) error {
	if cur.State == persist.StateNotSent {
		return fmt.Errorf("idem: loading intent %s: %w", cur.Key, err)
	}
	return fmt.Errorf("idem: loading intent %s: %w; %w", cur.Key, err, ErrOutcomeUnknown)
}

// recordExpiry ends a call of an intent too old to send: its outcome is
// unknown, and it is stored as expired, even if ctx is done: a call whose
// context ended before it began is still told the intent expired, not that
// the context ended it, and the app settles it through the lookup.
func (c *Client) recordExpiry(ctx context.Context, in *Intent, rec *persist.Record) error {
	err := &RetryError{Key: rec.Key, Reason: stopExpired}
	c.logUnknown(ctx, rec, err)
	if rec.State != persist.StateExpired {
		rec.State = persist.StateExpired
		rec.UpdatedAt = c.clock.Now()
		if saveErr := c.save(detached(ctx), in, rec, "record expiry"); saveErr != nil {
			return errors.Join(err, saveErr)
		}
	}
	return err
}

// sendable refuses, with a *notSentError, a record that no attempt could
// send (an older release's, say), before it is marked sent, and fixes the
// key's spelling of a record written before it was stored. checked says
// the record is the version this Client validated and saved last, not as
// expired (which a clock set back can make sendable again).
func (c *Client) sendable(rec *persist.Record, checked bool) error {
	if !checked {
		if err := (Request{Method: rec.Method, URL: rec.URL}).validate(); err != nil {
			return &notSentError{Key: rec.Key, Err: err}
		}
	}
	if rec.KeyHeader == "" {
		// Written before the spelling was stored: such a record was sent
		// with the spelling of the Client of its time, which is taken to be
		// this Client's. It is stored with the record's next version, so it
		// stays fixed from now on.
		rec.KeyHeader = c.keyHeader(rec.Key)
	}
	if !spells(rec.KeyHeader, rec.Key) {
		return &notSentError{Key: rec.Key, Err: fmt.Errorf("idem: the stored Idempotency-Key value %q does not spell the key", rec.KeyHeader)}
	}
	return nil
}

// hold makes this Client the holder of rec before it sends it, when it is
// sent again after it ended not sent, or resumed by a Client that did not
// arm it. It returns the version to send, whether it is still provably
// unsent, or moved: another Client moved the record on since cur was read,
// and the call goes on from what is stored (in holds it).
//
// Sent again, as the app asked: from the first byte on it may reach the
// server, so the store must stop saying it was not sent before then, or a
// crash during the send would leave it replaceable. Or resumed by a Client
// that did not arm it (another Client on the store, a later process): it
// takes the record over first, so that the Client that armed it can no
// longer take it for unsent and replace it. Either is one step with the
// store, only if the record is still the version read (persist.SaveIf):
// one extra write on resumes only, never on the tap's path. The claim
// says when its holder's call may begin a send at the latest, for the
// reconcile delay of any other Client.
func (c *Client) hold(ctx context.Context, in *Intent, rec, cur *persist.Record, unsent bool) (held *persist.Record, stillUnsent, moved bool, err error) {
	takeOver := rec.Holder != c.id
	if takeOver && rec.State != persist.StateNotSent {
		// The Client that armed it may be sending it: no trace of
		// this Client's attempts can tell it unsent.
		unsent = false
	}
	op := "send again"
	if takeOver {
		op = "take over"
	}
	if rec.State == persist.StateNotSent {
		rec.State = persist.StateNew
		// No send of it ever began: the server's retention of its key
		// starts no sooner than this one, as at the tap.
		rec.CreatedAt = c.clock.Now()
		c.keys.reborn(rec.Key, c.clocks.sinceBirth())
		c.clocks.stampInto(rec, true, new(persist.Clocks))
	}
	rec.Holder = c.id
	rec.UpdatedAt = c.clock.Now()
	// The claim carries the latest time this call may begin a send.
	cl := new(persist.Clocks)
	if rec.Clocks != nil {
		*cl = *rec.Clocks
	}
	c.clocks.stampSendBy(cl, c.policyFor(ctx).MaxElapsed)
	rec.Clocks = cl
	if err := c.saveIf(ctx, in, rec, cur, op); err != nil {
		var changed *persist.ConflictError
		if errors.As(err, &changed) {
			if changed.Current == nil {
				// Replaced by another Client for a changed request.
				c.keys.dropped(rec.Key)
				return nil, false, false, fmt.Errorf("%w; nothing was sent (key %s)", ErrIntentReplaced, rec.Key)
			}
			in.set(changed.Current)
			c.keys.saved.drop(rec.Key)
			return nil, false, true, nil
		}
		// Nothing of this call was sent. The write's result is unknown,
		// and the next call reads what the store holds. It may have
		// landed: the intent, armed again, may be sent by a later start,
		// so the error says the outcome is unknown. (A changed cart's
		// delete is conditional on the version read: it fails if the
		// write landed.)
		c.keys.noAttempt(rec.Key, c.clocks.read())
		var se *SaveError
		if errors.As(err, &se) {
			se.mayHaveLanded = true
		}
		return nil, false, false, err
	}
	again := *rec
	return &again, unsent, false, nil
}

// recordNoAnswer records a call that ended without a final answer, and
// returns its error: a *notSentError when nothing can have reached the
// server, else retryErr, the outcome unknown.
//
// "Not sent" is judged by the transport's trace alone (WroteHeaders),
// never by the final error: net/http resends a request that carries an
// Idempotency-Key on a new connection, so a dial error can follow bytes
// written earlier.
func (c *Client) recordNoAnswer(ctx context.Context, in *Intent, rec *persist.Record, retryErr *RetryError) error {
	now := c.clock.Now()
	// The call made one attempt, which failed for good and never reached
	// the server.
	oneNeverReached := retryErr.Reason == stopFatal && retryErr.Attempts == 1 && retryErr.unreached
	if retryErr.Attempts == 0 {
		c.keys.noAttempt(rec.Key, c.clocks.read())
	} else if c.keys.ended(rec.Key, !retryErr.noneWritten, c.clocks.read()) == vNotSent {
		return c.recordNotSent(ctx, in, rec, retryErr, now)
	}
	c.logUnknown(ctx, rec, retryErr)
	if oneNeverReached {
		// The one attempt never reached the server, but an earlier one
		// may have: nothing to record.
		return retryErr
	}
	rec.Attempts += retryErr.Attempts
	rec.Redirected = rec.Redirected || retryErr.afterRedirect
	rec.UpdatedAt = now
	if retryErr.Reason == stopExpired {
		rec.State = persist.StateExpired
	} else if retryErr.Attempts > 0 {
		rec.State = persist.StatePending
	}
	// The save records what is known; if it fails, the intent stays
	// unresolved in the store anyway, which is the safe side.
	if retryErr.Attempts > 0 || retryErr.Reason == stopExpired {
		if saveErr := c.save(detached(ctx), in, rec, "record attempts"); saveErr != nil {
			return errors.Join(retryErr, saveErr)
		}
	}
	return retryErr
}

// recordNotSent records a call none of whose attempts wrote its request,
// as the transport's trace shows (the network was down, the host unknown,
// the connection refused, the certificate refused), of an intent no
// attempt before it can have sent: the intent stays provably unsent, so
// Intent may replace it. The store says so too, so that after a restart
// SettleAll does not send what the app was told was not sent.
//
// The app is told "not sent" only once the store says so: a not-sent
// write that failed, or whose result is unknown, did not make the intent
// not sent, and the call ends with the outcome unknown (retryErr, with the
// store's error).
func (c *Client) recordNotSent(ctx context.Context, in *Intent, rec *persist.Record, retryErr *RetryError, now time.Time) error {
	err := &notSentError{Key: rec.Key, Err: retryErr.Err, Attempts: retryErr.Attempts, Reason: retryErr.Reason}
	if err.Err == nil || errors.Is(err.Err, errStopped) {
		err.Err = errors.New("idem: no attempt wrote the request")
	}
	if rec.State == persist.StateNotSent || in.ephemeral {
		c.logNotSent(ctx, rec, err)
		c.keys.notSent(rec.Key)
		return err
	}
	// Only if no other Client took it over since this call began: one
	// that did may have sent it.
	prev := in.current()
	rec.State = persist.StateNotSent
	rec.UpdatedAt = now
	if saveErr := c.saveIf(detached(ctx), in, rec, prev, "record not sent"); saveErr != nil {
		c.logUnknown(ctx, rec, retryErr)
		c.keys.storeFailed(rec.Key)
		if errors.As(saveErr, new(*persist.ConflictError)) {
			return retryErr
		}
		return errors.Join(retryErr, saveErr)
	}
	c.logNotSent(ctx, rec, err)
	c.keys.notSent(rec.Key)
	return err
}

// recordAnswer records the final answer of a call and returns it, with an
// *APIError if it is not a success and a *SaveError if it was not saved.
func (c *Client) recordAnswer(ctx context.Context, in *Intent, rec *persist.Record, resp *Response) (*Response, error) {
	rec.Attempts += resp.Attempts
	rec.UpdatedAt = c.clock.Now()
	rec.State = c.stateFor(resp.StatusCode, resp.Header, resp.Body)
	// The caller owns resp; the record keeps its own copy.
	rec.Response = c.stored(resp)
	if c.logs(ctx, slog.LevelInfo) { // skip building the line when silent
		c.logger.LogAttrs(ctx, slog.LevelInfo,
			fmt.Sprintf("idem: answered %d %s after %d attempt(s)", resp.StatusCode, http.StatusText(resp.StatusCode), resp.Attempts),
			slog.String("key", rec.Key), slog.String("name", rec.Name), slog.Bool("replayed", resp.Replayed))
	}
	// The answer is final whatever happens to the save: the server keeps
	// it and replays it to the next Do. Save even if ctx is done now, so a
	// cancel right after the answer does not cost the record.
	//
	// The save need not be durable before Do returns, only before the
	// server forgets the key: until it is, a crash of the process leaves
	// it written, and a power loss the intent unresolved, which Do
	// resumes with the same key to the server's replay of this answer.
	// So a store that can defers its sync (persist.WithDeferredSync),
	// off the path the user waits on.
	saveErr := c.saveWith(detached(ctx), in, rec, "record outcome", func(ctx context.Context, s persist.Store, rec, prev *persist.Record) error {
		return c.writeOwn(persist.WithDeferredSync(ctx), s, rec, prev)
	})
	if saveErr != nil && errors.As(saveErr, new(*adoptedError)) {
		// Another call stored the server's word first: it stands.
		return c.adopted(saveErr)
	}
	if saveErr == nil {
		c.keys.forget(rec.Key)
	} else {
		// The answer is never reported as "not sent": it is returned,
		// marked as not recorded.
		resp.NotRecorded = true
	}
	apiErr := c.apiErrorFor(rec, resp)
	switch {
	case apiErr != nil && saveErr != nil:
		return resp, errors.Join(apiErr, saveErr)
	case apiErr != nil:
		return resp, apiErr
	case saveErr != nil:
		return resp, saveErr
	}
	return resp, nil
}

// logUnknown tells the app's logger (WARN, above INFO) of a call that
// ended with its outcome unknown, and why.
func (c *Client) logUnknown(ctx context.Context, rec *persist.Record, err *RetryError) {
	if c.logs(ctx, slog.LevelWarn) {
		c.logger.LogAttrs(ctx, slog.LevelWarn, fmt.Sprintf("idem: outcome unknown after %d attempt(s): %s", err.Attempts, err.Reason),
			slog.String("key", rec.Key), slog.String("name", rec.Name))
	}
}

// logNotSent tells the app's logger (INFO) of a call that ended not sent,
// once the store says so.
func (c *Client) logNotSent(ctx context.Context, rec *persist.Record, err *notSentError) {
	if c.logs(ctx, slog.LevelInfo) {
		c.logger.LogAttrs(ctx, slog.LevelInfo, fmt.Sprintf("idem: not sent after %d attempt(s): %s", err.Attempts, err.Reason),
			slog.String("key", rec.Key), slog.String("name", rec.Name), slog.String("error", err.Err.Error()))
	}
}

// storedOutcome answers Do for a resolved intent without sending.
func (c *Client) storedOutcome(rec *persist.Record) (*Response, error) {
	if rec.Response == nil {
		// Resolved without an answer: reconciled as never done.
		return nil, fmt.Errorf("idem: intent %s is %s: the server has no effect for its key; create a new intent to try again", rec.Key, rec.State)
	}
	resp := responseFromStored(rec.Response, 0, true)
	if err := c.apiErrorFor(rec, resp); err != nil {
		return resp, err
	}
	return resp, nil
}

// save makes rec the intent's current version and stores it, over the
// version the store holds only as afterConflict allows. rec must not be
// changed afterwards.
func (c *Client) save(ctx context.Context, in *Intent, rec *persist.Record, op string) error {
	return c.saveWith(ctx, in, rec, op, c.writeOwn)
}

// writeOwn writes rec, starting from prev, the version this Client holds.
// The store's write is conditional: when another version is stored now,
// afterConflict decides. A resolved record is never overwritten: writeOwn
// returns an *adoptedError holding it. Another Client's record is never
// overwritten either, but by the server's answer: the store's
// *ConflictError is returned. Only this Client's own later version, or a
// record gone from the store (Forget), is written over.
func (c *Client) writeOwn(ctx context.Context, s persist.Store, rec, prev *persist.Record) error {
	for range 8 {
		err := s.Write(ctx, rec, prev)
		if err == nil {
			return nil
		}
		var changed *persist.ConflictError
		if !errors.As(err, &changed) {
			return err
		}
		switch afterConflict(changed.Current, rec, prev, c.id) {
		case cLanded:
			return nil
		case cAdopt:
			return &adoptedError{rec: changed.Current}
		case cYield, cRefused:
			return err
		}
		prev = changed.Current
	}
	return fmt.Errorf("idem: intent %s changed under every write", rec.Key)
}

// adoptedError is a write refused because the stored record is resolved:
// the server's word, which the caller adopts and tells.
type adoptedError struct{ rec *persist.Record }

func (e *adoptedError) Error() string {
	return fmt.Sprintf("idem: intent %s is already %s", e.rec.Key, e.rec.State)
}

// adopted answers a call whose record another Client (or call) resolved
// while it ran: the stored outcome, if err says so; else err.
func (c *Client) adopted(err error) (*Response, error) {
	var a *adoptedError
	if errors.As(err, &a) {
		c.keys.forget(a.rec.Key)
		return c.storedOutcome(a.rec)
	}
	return nil, err
}

// saveIf is save only if the stored record is still old's version
// (persist.SaveIf).
func (c *Client) saveIf(ctx context.Context, in *Intent, rec, old *persist.Record, op string) error {
	return c.saveWith(ctx, in, rec, op, func(ctx context.Context, s persist.Store, rec, _ *persist.Record) error {
		return persist.SaveIf(ctx, s, rec, old)
	})
}

// saveWith is save through store: writeOwn or persist.SaveIf, given
// prev, the version in held before.
func (c *Client) saveWith(ctx context.Context, in *Intent, rec *persist.Record, op string, store func(ctx context.Context, s persist.Store, rec, prev *persist.Record) error) error {
	if !in.ephemeral {
		c.clocks.stamp(rec, false)
	}
	rec.Rev = persist.NewRev()
	prev := in.current()
	in.set(rec)
	if in.ephemeral {
		return nil
	}
	// The record is immutable from here on (see Intent.current): the
	// store may keep it rather than copy it.
	if err := store(ctx, c.store, rec, prev); err != nil {
		// The intent is what the store holds: an outcome that was not
		// saved (a void that Reconcile concluded, say) is not reported
		// by State, or the app could act on it while the store would
		// send the intent again.
		in.set(prev)
		var a *adoptedError
		if errors.As(err, &a) {
			in.set(a.rec)
		}
		c.keys.saved.drop(rec.Key)
		c.log(ctx, slog.LevelError, "idem: save failed", "key", rec.Key, "op", op, "error", err)
		return &SaveError{Key: rec.Key, Op: op, Err: err}
	}
	c.keys.saved.saved(rec)
	return nil
}

// left returns how long the intent of rec may still be sent, by the
// largest age any clock reports.
func (c *Client) left(rec *persist.Record) time.Duration {
	l := c.leftOf(rec)
	return l.left()
}

// leftOf is the reading of how long the intent of rec may still be sent
// that a call's budget holds.
func (c *Client) leftOf(rec *persist.Record) intentLeft {
	return intentLeft{clocks: c.clocks, clock: c.clock, keys: c.keys, window: c.retention - c.margin, rec: rec}
}

// detached returns ctx without its cancel, so that a save that records
// what happened is made even after the caller's context ended: ctx
// itself when nothing can cancel it (its Done is nil), which saves the
// wrapper.
func detached(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}
