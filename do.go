package idem

import (
	"context"
	"errors"
	"net/http"

	"github.com/idemkit/idem/persist"
)

// Do sends the intent and returns its final answer. The answer's save on the
// device may fail. The answer is then returned all the same, with
// NotRecorded set. The error is then a *SaveError (Op "record outcome"). The
// payment it reports happened.
//
// An intent made by Intent or NewIntent is armed by its first Do. Arming
// saves it durably, in the one write before its first byte is sent. If that
// write fails (a *SaveError), nothing is sent. The error matches
// ErrOutcomeUnknown, for the write may have landed.
//
// A resolved intent is not sent. Do returns the stored answer with FromStore
// set. An unresolved intent is sent with its key and exact bytes. It is
// retried under the Client's RetryPolicy. A 2xx answer returns the Response
// and a nil error. Any other final answer returns the Response and an
// *APIError. (That may be a declined card, or a 422.) Such an answer is
// stored and never retried. When no final answer arrives, Do returns a
// *RetryError. It matches ErrOutcomeUnknown, and the intent stays
// unresolved. Do it again later.
//
// Do may fail to read the intent's record from the store. (Its context
// ended, or the store failed.) Then it sends nothing and returns the store's
// error, or the context's. That error matches ErrOutcomeUnknown too, for an
// earlier attempt may have reached the server. It does not when the intent
// was stored not sent.
func (c *Client) Do(ctx context.Context, in *Intent) (*Response, error) {
	if !in.made() {
		return nil, errors.New("idem: Do with a nil or zero intent: " + madeBy)
	}
	if err := checkPolicy(ctx); err != nil {
		return nil, err
	}
	// The tap makes an unarmed intent durable before its first byte.
	if err := c.arm(ctx, in); err != nil {
		return nil, err
	}
	ask := callAsk{tick: c.keys.callTick()}
	resp, err := c.flights.do(ctx, in.Key(), func() (*Response, error) { return c.doAs(ctx, in, c.retry, nil, ask) })
	return resp, forCall(err, callDo)
}

// callAsk is who asks a call to send. That is the app (Do, Settle, Send, the
// RoundTripper), or SettleAll in the background. SettleAll never sends what
// the app was told was not sent. tick is when the app asked (keys.callTick).
// A call asked for before the intent ended not sent is not the app asking
// again.
type callAsk struct {
	background bool
	tick       uint64
}

// do is doAs for a call the app asks for now.
func (c *Client) do(ctx context.Context, in *Intent, r *retrier, header http.Header) (*Response, error) {
	return c.doAs(ctx, in, r, header, callAsk{tick: c.keys.callTick()})
}

// doAs runs one call for in through r. header, if not nil, replaces the
// stored headers. (The RoundTripper sends the live request's headers.) First
// it reads the record's current version. It refuses what may not be sent,
// being too old or unsendable. It holds the record for this Client, and
// sends. Then it records what came of it: not sent, unknown, or the final
// answer.
func (c *Client) doAs(ctx context.Context, in *Intent, r *retrier, header http.Header, ask callAsk) (*Response, error) {
	for {
		resp, err := c.callOnce(ctx, in, r, header, ask)
		if err != errMoved { //nolint:errorlint // callOnce's own sentinel, never wrapped
			return resp, err
		}
		// Another Client moved the record on since it was read. Go on from
		// what is stored.
	}
}

// errMoved is callOnce's word that another Client moved the record on. That
// happened before this call could hold it. It never leaves doAs.
var errMoved = errors.New("idem: the record moved on")

// callOnce is doAs from one read of the record.
func (c *Client) callOnce(ctx context.Context, in *Intent, r *retrier, header http.Header, ask callAsk) (*Response, error) {
	cur, known, err := c.currentVersion(ctx, in)
	if err != nil {
		return nil, err
	}
	if cur.State.Resolved() {
		return c.storedOutcome(cur)
	}
	// rec is this call's next version of the record. It is made with room
	// for its answer (recordAnswer).
	next := &nextVersion{rec: *cur}
	rec := &next.rec
	if in.ephemeral {
		// It is used for this one call, so there is nothing to remember
		// about it.
		defer c.keys.forget(rec.Key)
	}
	// This is how long the intent may still be sent, by the largest age any
	// clock reports. It is read again before every attempt and wait
	// (intentLeft). The age counts from the first moment a send could have
	// begun. An intent stored not sent was never on the wire. Its age starts
	// again when it is sent again (see hold).
	//
	// One reading of the clocks serves this check and mustHold's below.
	// Nothing between the two waits or writes, so a second reading would
	// tell nothing more.
	// A record stored expired is never sent again, however young it reads.
	// A clock set back can make it so. So can a dispute over a void (see
	// arbitrate). Only the lookup settles it.
	now := c.clocks.read()
	if rec.State == persist.StateExpired || rec.State != persist.StateNotSent && c.leftAt(rec, now) <= 0 {
		return c.adopted(c.recordExpiry(ctx, in, rec))
	}
	if err := c.sendable(rec, known && cur.State != persist.StateExpired); err != nil {
		return nil, err
	}
	// A per-request key of the RoundTripper's is new with this call. A key
	// the caller chose may have been sent by its own earlier retry.
	if in.ephemeral && rec.Attempts == 0 && !in.callersKey {
		c.keys.armed(rec.Key, c.clocks.sinceBirth())
	}
	// The table decides at the moment of sending, from the version just
	// read. It decides whether the intent may be sent, and whether it is
	// provably unsent.
	unsent, err := c.keys.begin(rec, ask.background, ask.tick)
	if err != nil {
		return nil, err
	}
	if !in.ephemeral && c.mustHold(ctx, rec, now) {
		held, moved, err := c.hold(ctx, in, rec, cur, unsent)
		if moved {
			c.keys.forget(rec.Key)
			return nil, errMoved
		}
		if err != nil {
			return nil, err
		}
		rec = held
	}

	if header == nil {
		header = rec.Header
	}
	resp, retryErr := newCall(ctx, &c.config, c.tokens, c.leftOf(rec), rec, header).run(ctx, r)
	if retryErr != nil {
		return c.adopted(c.recordNoAnswer(ctx, in, rec, retryErr))
	}
	return c.recordAnswer(ctx, in, rec, resp, next, c.arbitrate)
}
