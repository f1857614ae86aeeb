package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem/persist"
)

// Response is the final answer to an intent.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	// Replayed is true when the server answered from its idempotency
	// record (Idempotent-Replayed: true): the work was done by an earlier
	// attempt, whose answer had been lost.
	Replayed bool
	// Attempts is how many attempts this call put on the wire; 0 when the
	// answer came from the device's store.
	Attempts int
	// FromStore is true when the intent was already resolved and nothing
	// was sent.
	FromStore bool
	// NotRecorded is true when this answer arrived but the device could
	// not save it (Do returns it with a *SaveError): the answer is the
	// server's and final all the same, but the intent stays unresolved on
	// the device, and the next Do gets the server's replay of it.
	NotRecorded bool
	// Oversized is true when the answer was larger than
	// WithMaxResponseBytes (header fields and body together). Its status is
	// known and the intent is resolved from it, but its body was not kept
	// (Body is nil), and its header fields only those stored, so far as
	// they fit the limit.
	Oversized bool
}

func responseFromStored(r *persist.Response, attempts int, fromStore bool) *Response {
	return &Response{
		StatusCode: r.StatusCode,
		Header:     r.Header.Clone(),
		Body:       bytes.Clone(r.Body),
		Replayed:   r.Replayed,
		Oversized:  r.Oversized,
		Attempts:   attempts,
		FromStore:  fromStore,
	}
}

func (r *Response) clone() *Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = bytes.Clone(r.Body)
	return &c
}

// Do sends the intent and returns its final answer. An answer whose save
// on the device failed is returned all the same, with NotRecorded set and
// a *SaveError (Op "record outcome"): the payment it reports happened.
//
// An intent made by Intent or NewIntent is armed by its first Do: saved
// durably, in the one write before its first byte is sent. If that write
// fails (a *SaveError) nothing is sent.
//
// A resolved intent is not sent: Do returns the stored answer with
// FromStore set. An unresolved one is sent with its key and exact bytes,
// and retried under the Client's RetryPolicy. A 2xx answer returns the
// Response and a nil error. Any other final answer (a declined card, a
// 422) returns the Response and an *APIError; it is stored and never
// retried. When no final answer arrives, Do returns a *RetryError matching
// ErrOutcomeUnknown and the intent stays unresolved: Do it again later.
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
	return c.flights.do(ctx, in.Key(), func() (*Response, error) { return c.do(ctx, in, c.retry, nil) })
}

// do runs one call for in through r. header, if not nil, replaces the
// stored headers (the RoundTripper sends the live request's).
func (c *Client) do(ctx context.Context, in *Intent, r *retrier, header http.Header) (*Response, error) {
	cur := in.current()
	// Intent deleted a replaced intent from the store: say so, rather
	// than that the store has no such intent.
	if err := c.notReplaced(cur.Key); err != nil {
		return nil, err
	}
	// The store is the truth: another Intent value for this key, or an
	// earlier process, may have moved an unresolved intent on. A resolved
	// one never changes, and one that holds the version this Client saved
	// last is current: neither needs the read.
	known := c.latest.is(cur)
	if !in.ephemeral && !cur.State.Resolved() && !known {
		stored, err := c.store.Get(ctx, cur.Key)
		if err != nil {
			return nil, fmt.Errorf("idem: loading intent %s: %w", cur.Key, err)
		}
		in.set(stored)
		cur = stored
		known = false
	}
	if cur.State.Resolved() {
		return c.storedOutcome(cur)
	}
	// rec is this call's next version of the record.
	next := *cur
	rec := &next
	if in.ephemeral {
		// Used for this one call: nothing to remember about it.
		defer c.settled(rec.Key)
	}
	// How long the intent may still be sent, by the largest age any clock
	// reports, read again before every attempt and wait.
	left := func() time.Duration { return c.retention - c.margin - c.age(rec, c.clock.Now()) }
	if left() <= 0 {
		err := &RetryError{Key: rec.Key, Reason: StopExpired}
		if rec.State != persist.StateExpired {
			rec.State = persist.StateExpired
			rec.UpdatedAt = c.clock.Now()
			if saveErr := c.save(ctx, in, rec, "record expiry"); saveErr != nil {
				return nil, errors.Join(err, saveErr)
			}
		}
		return nil, err
	}
	// A record that no attempt could send (an older release's, say) is
	// refused before it is marked sent. The version this Client saved last
	// was checked before it was saved, unless it was saved as expired
	// (which a clock set back can make sendable again).
	if !known || cur.State == persist.StateExpired {
		if err := (Request{Method: rec.Method, URL: rec.URL}).validate(); err != nil {
			return nil, &NotSentError{Key: rec.Key, Err: err}
		}
	}
	if rec.KeyHeader == "" {
		// Written before the spelling was stored: such a record was sent
		// with the spelling of the Client of its time, which is taken to be
		// this Client's. It is stored with the record's next version, so it
		// stays fixed from now on.
		rec.KeyHeader = c.keyHeader(rec.Key)
	}
	if !c.spells(rec.KeyHeader, rec.Key) {
		return nil, &NotSentError{Key: rec.Key, Err: fmt.Errorf("idem: the stored Idempotency-Key value %q does not spell the key", rec.KeyHeader)}
	}
	unsent, err := c.markSent(rec.Key, rec.State == persist.StateNotSent)
	if err != nil {
		return nil, err
	}
	// A per-request key of the RoundTripper's is new with this call; a key
	// the caller chose may have been sent by its own earlier retry.
	unsent = unsent || in.ephemeral && rec.Attempts == 0 && !in.callersKey
	if !in.ephemeral && (rec.State == persist.StateNotSent || rec.Holder != c.id) {
		// Sent again, as the app asked: from the first byte on it may
		// reach the server, so the store must stop saying it was not sent
		// before then, or a crash during the send would leave it
		// replaceable. Or resumed by a Client that did not arm it (another
		// Client on the store, a later process): it takes the record over
		// first, so that the Client that armed it can no longer take it
		// for unsent and replace it. Either is one step with the store,
		// only if the record is still the version read (persist.SaveIf):
		// one extra write on resumes only, never on the tap's path.
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
		}
		rec.Holder = c.id
		rec.UpdatedAt = c.clock.Now()
		if err := c.saveIf(ctx, in, rec, cur, op); err != nil {
			var changed *persist.ChangedError
			if errors.As(err, &changed) {
				if changed.Current == nil {
					// Replaced by another Client for a changed request.
					return nil, fmt.Errorf("%w; nothing was sent (key %s)", ErrIntentReplaced, rec.Key)
				}
				// Another Client moved it on since it was read: go on
				// from what is stored.
				in.set(changed.Current)
				c.latest.forget(rec.Key)
				return c.do(ctx, in, r, header)
			}
			if unsent {
				c.markCreated(rec.Key)
			}
			return nil, err
		}
		again := *rec
		rec = &again
	}

	if header == nil {
		header = rec.Header
	}
	resp, retryErr := c.send(ctx, r, rec, header, left, unsent)
	c.sent(rec.Key)
	if retryErr != nil && retryErr.Attempts == 0 && unsent {
		// Nothing reached the wire: the intent is still provably unsent.
		c.markCreated(rec.Key)
	}
	now := c.clock.Now()
	notSent := retryErr != nil && (retryErr.sentNothing && retryErr.Attempts > 0 ||
		retryErr.Reason == StopFatal && retryErr.Attempts == 1 && retryErr.neverReached)
	if notSent && unsent {
		// No attempt of this call wrote its request, as the transport's
		// trace shows (the network was down, the host unknown, the
		// connection refused, the certificate refused), and no attempt
		// before it can have: the intent stays provably unsent, so Intent
		// may replace it. The store says so too, so that after a restart
		// SettleAll does not send what the app was told was not sent.
		c.markCreated(rec.Key)
		err := &NotSentError{Key: rec.Key, Err: retryErr.Err}
		if err.Err == nil || errors.Is(err.Err, errStopped) {
			err.Err = fmt.Errorf("idem: no attempt wrote the request (%s)", retryErr.Reason)
		}
		if rec.State != persist.StateNotSent && !in.ephemeral {
			// Only if no other Client took it over since this call began:
			// one that did may have sent it.
			prev := in.current()
			rec.State = persist.StateNotSent
			rec.UpdatedAt = now
			if saveErr := c.saveIf(context.WithoutCancel(ctx), in, rec, prev, "record not sent"); saveErr != nil {
				if errors.Is(saveErr, persist.ErrChanged) {
					c.undropTaken(rec.Key)
					return nil, retryErr
				}
				return nil, errors.Join(err, saveErr)
			}
		}
		return nil, err
	}
	if retryErr != nil && retryErr.Reason == StopFatal && retryErr.Attempts == 1 && retryErr.neverReached {
		// The one attempt never reached the server, but an earlier one
		// may have: nothing to record.
		return nil, retryErr
	}
	if retryErr != nil {
		rec.Attempts += retryErr.Attempts
		rec.Redirected = rec.Redirected || retryErr.redirected
		rec.UpdatedAt = now
		if retryErr.Reason == StopExpired {
			rec.State = persist.StateExpired
		} else if retryErr.Attempts > 0 {
			rec.State = persist.StatePending
		}
		c.log(ctx, slog.LevelWarn, "idem: outcome unknown", "key", rec.Key, "attempts", retryErr.Attempts, "reason", string(retryErr.Reason))
		// The save records what is known; if it fails, the intent stays
		// unresolved in the store anyway, which is the safe side.
		if retryErr.Attempts > 0 || retryErr.Reason == StopExpired {
			if saveErr := c.save(context.WithoutCancel(ctx), in, rec, "record attempts"); saveErr != nil {
				return nil, errors.Join(retryErr, saveErr)
			}
		}
		return nil, retryErr
	}

	rec.Attempts += resp.Attempts
	rec.UpdatedAt = now
	rec.State = c.stateFor(resp.StatusCode, resp.Header, resp.Body)
	// The caller owns resp; the record keeps its own copy.
	rec.Response = c.stored(resp)
	if c.logger != nil { // skip building the arguments when silent
		c.log(ctx, slog.LevelInfo, "idem: resolved", "key", rec.Key, "status", resp.StatusCode, "attempts", resp.Attempts, "replayed", resp.Replayed)
	}
	// The answer is final whatever happens to the save: the server keeps
	// it and replays it to the next Do. Save even if ctx is done now, so a
	// cancel right after the answer does not cost the record.
	//
	// The save need not be durable before Do returns, only before the
	// server forgets the key: until it is, a crash of the process leaves
	// it written, and a power loss the intent unresolved, which Do
	// resumes with the same key to the server's replay of this answer.
	// So a store that can defers its sync (persist.DeferredSaver), off
	// the path the user waits on.
	saveErr := c.saveWith(context.WithoutCancel(ctx), in, rec, "record outcome", persist.SaveDeferred)
	if saveErr == nil {
		c.settled(rec.Key)
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

// stored returns what the device keeps of a final answer: its status, the
// header fields that a replay and the app need, and its body.
func (c *Client) stored(resp *Response) *persist.Response {
	return &persist.Response{
		StatusCode: resp.StatusCode,
		Header:     c.storedHeader(resp.Header),
		Body:       bytes.Clone(resp.Body),
		Replayed:   resp.Replayed,
		Oversized:  resp.Oversized,
	}
}

// storedHeader returns the header fields of h that are kept on the device:
// those of storedHeaders and those the app named (WithStoredHeaders), in
// that order, while they fit the Client's limit on an answer. Nothing else
// (cookies, tokens, tracing) is written to the device.
func (c *Client) storedHeader(h http.Header) http.Header {
	var (
		out  http.Header
		size int64
	)
	for _, name := range c.keptHeaders {
		vs := h[name]
		if len(vs) == 0 {
			continue
		}
		n := fieldBytes(name, vs)
		if size+n > c.maxBody {
			continue
		}
		size += n
		if out == nil {
			out = make(http.Header, len(c.keptHeaders))
		}
		out[name] = append([]string(nil), vs...)
	}
	return out
}

// storedHeaders are the header fields of a final answer that are kept on
// the device by default: what an app shows (the media type, where the new
// resource is), the replay marker, and the server's Retry-After.
var storedHeaders = []string{"Content-Type", "Location", "Idempotent-Replayed", "Retry-After"}

// headerBytes is the size of h as header fields on the wire: the size
// counted against the limit on an answer.
func headerBytes(h http.Header) int64 {
	var n int64
	for name, vs := range h {
		n += fieldBytes(name, vs)
	}
	return n
}

func fieldBytes(name string, vs []string) int64 {
	var n int64
	for _, v := range vs {
		n += int64(len(name) + len(v) + 4) // ": " and CRLF
	}
	return n
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

// save makes rec the intent's current version and stores it. rec must not
// be changed afterwards.
func (c *Client) save(ctx context.Context, in *Intent, rec *persist.Record, op string) error {
	return c.saveWith(ctx, in, rec, op, persist.SaveShared)
}

// saveIf is save only if the stored record is still old's version
// (persist.SaveIf).
func (c *Client) saveIf(ctx context.Context, in *Intent, rec, old *persist.Record, op string) error {
	return c.saveWith(ctx, in, rec, op, func(ctx context.Context, s persist.Store, rec *persist.Record) error {
		return persist.SaveIf(ctx, s, rec, old)
	})
}

// saveWith is save through store, persist.SaveShared or
// persist.SaveDeferred.
func (c *Client) saveWith(ctx context.Context, in *Intent, rec *persist.Record, op string, store func(context.Context, persist.Store, *persist.Record) error) error {
	if !in.ephemeral {
		c.stamp(rec, false)
	}
	prev := in.current()
	in.set(rec)
	if in.ephemeral {
		return nil
	}
	// The record is immutable from here on (see Intent.current): the
	// store may keep it rather than copy it.
	if err := store(ctx, c.store, rec); err != nil {
		// The intent is what the store holds: an outcome that was not
		// saved (a void that Reconcile concluded, say) is not reported
		// by State, or the app could act on it while the store would
		// send the intent again.
		in.set(prev)
		c.latest.forget(rec.Key)
		c.log(ctx, slog.LevelError, "idem: save failed", "key", rec.Key, "op", op, "error", err)
		return &SaveError{Key: rec.Key, Op: op, Err: err}
	}
	c.latest.saved(rec)
	return nil
}

// stateFor classifies a final answer.
func (c *Client) stateFor(status int, header http.Header, body []byte) persist.State {
	switch {
	case status >= 200 && status < 300:
		return persist.StateSucceeded
	case c.keyReused(status, header, body),
		isKeyProblem(status, parseProblem(header, body).Type):
		return persist.StateRejected
	}
	return persist.StateFailed
}

// keyReused reports a final answer that says the key was used with another
// request: see ErrKeyReused.
func (c *Client) keyReused(status int, header http.Header, body []byte) bool {
	if status >= 200 && status < 300 {
		return false
	}
	if isKeyReused(status, header, body) {
		return true
	}
	return c.isKeyReused != nil && c.isKeyReused(&Response{StatusCode: status, Header: header.Clone(), Body: bytes.Clone(body)})
}

func (c *Client) apiErrorFor(rec *persist.Record, resp *Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return &APIError{
		Method:     rec.Method,
		URL:        rec.URL,
		Key:        rec.Key,
		StatusCode: resp.StatusCode,
		Problem:    parseProblem(resp.Header, resp.Body),
		Response:   resp,
		keyReused:  c.keyReused(resp.StatusCode, resp.Header, resp.Body),
	}
}
