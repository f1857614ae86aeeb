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

// Reconcile asks the server what became of an intent whose outcome is
// unknown. It never sends the intent again. It asks the lookup that
// Server.Lookup gives, such as GET /payments?idempotency_key=K. Reconcile
// settles an expired intent, or one the app no longer wants to resume.
// Settle calls it when sending again is no longer safe. Without a lookup
// it returns an error and changes nothing.
//
// The lookup acts for the intent's caller, as its attempts did. It carries
// the intent's stored header fields, and Config.Authorizer's credentials.
//
// Only the server's word settles the intent. A 2xx with the key's echo or
// the Mark's recognition makes it succeeded. The typed miss that echoes
// this lookup's nonce makes it void. That happens only once no attempt can
// still arrive (Server.ReconcileDelay). Every other answer changes nothing.
// Then the error matches ErrOutcomeUnknown and says what to do. A
// redirect is not followed, so give the lookup's final URL.
//
// Reconcile returns the lookup's answer, and in.State() tells what was
// concluded. A resolved intent is returned as it is, and nothing is sent.
// A Do of the same intent waits while Reconcile runs. Reconcile returns
// ErrInFlight if a Do for the intent is running. The lookup takes at most
// RetryPolicy.MaxElapsed, the call's or else the Client's.
//
// docs/CLIENT.md, "Reconciling", gives each answer and each wait in full.
func (c *Client) Reconcile(ctx context.Context, in *Intent) (*Response, error) {
	if !in.made() {
		return nil, errors.New("idem: Reconcile with a nil or zero intent: " + madeBy)
	}
	if err := checkPolicy(ctx); err != nil {
		return nil, err
	}
	if c.lookup == nil {
		return nil, fmt.Errorf("idem: cannot reconcile intent %s: the Client has no lookup (Server.Lookup)", in.Key())
	}
	if in.State() == persist.StateNew && in.isUnarmed() {
		return nil, fmt.Errorf("idem: intent %s was never armed, so never sent: there is nothing to reconcile", in.Key())
	}
	key := in.Key()
	lookupURL := c.lookup(in.Request(), key)
	var (
		resp *Response
		err  error
	)
	// Holding the key keeps a Do from sending while the lookup decides.
	// It also keeps the Do's save from racing this one's.
	if !c.flights.exclusive(key, func() { resp, err = c.askLookup(ctx, in, key, lookupURL) }) {
		return nil, fmt.Errorf("%w: %s; reconcile it when the Do returns", ErrInFlight, key)
	}
	return resp, err
}

// askLookup is Reconcile's body. It runs while no call of key runs in this
// Client. It asks the server's lookup at lookupURL what became of key. It
// concludes only on the server's word.
func (c *Client) askLookup(ctx context.Context, in *Intent, key, lookupURL string) (*Response, error) {
	cur, err := c.store.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("idem: loading intent %s: %w", key, err)
	}
	in.set(cur)
	if cur.State.Resolved() {
		return c.storedOutcome(cur)
	}
	// Whether an attempt may still arrive is decided as the lookup leaves.
	// Its answer tells the server's state from then on. An attempt that
	// arrives while the lookup is on its way is not in it.
	// A request in the app's hands (HTTPRequest) may be sent until the
	// send deadline its hand-out stored. That is the server's retention
	// from then, or the end the app reported (SendEnded).
	wait := func() time.Duration {
		return c.keys.mayStillArrive(key, c.clocks.read(), c.clocks.birth, c.reconcile, cur, c.id)
	}
	rec, out, err := c.lookupOnce(ctx, cur, key, lookupURL, wait)
	if rec == nil {
		return out, err
	}
	return c.recordLookup(ctx, in, rec, out, key)
}

// lookupOnce asks the lookup at lookupURL what became of key, whose stored
// record is cur. It returns the record the server's word makes of cur, with
// the lookup's answer. Or it returns no record, and why the answer settles
// nothing. wait says, as the lookup leaves, how much longer an attempt may
// still arrive.
func (c *Client) lookupOnce(ctx context.Context, cur *persist.Record, key, lookupURL string, wait func() time.Duration) (*persist.Record, *Response, error) {
	// The lookup is one request. RetryPolicy.MaxElapsed bounds it in real
	// time, whatever the http.Client's Timeout.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.policyFor(ctx).MaxElapsed)
	defer cancel()
	// An error of the lookup's own limit is the budget's, not the
	// caller's deadline. The URL in net/http's error loses its
	// credentials.
	cut := func(err error) error {
		err = redactErr(err)
		if ctx.Err() != nil && parent.Err() == nil {
			return &budgetSpent{reason: stopElapsed, err: err}
		}
		return err
	}
	req, nonce, err := c.lookupRequest(ctx, cur, key, lookupURL, cut)
	if err != nil {
		return nil, nil, err
	}
	w := wait()
	out, err := c.lookupAnswer(req, key, cut)
	if err != nil {
		return nil, nil, err
	}
	next := *cur
	if resp, err := c.judgeLookup(&next, out, key, lookupURL, nonce, w); err != nil {
		return nil, resp, err
	}
	return &next, out, nil
}

// arbitrate settles a dispute between the answer a call holds and another
// Client's void of the same intent (disputedError). The server's lookup
// decides, with a fresh nonce. The answer is told only if the server holds
// the key. Then it is written over the void, once. The server's typed miss
// keeps the void, and the caller tells it (an *adoptedError). No attempt of
// the intent is on its way. The call got its answer, and the void was
// concluded past every other's. So nothing is waited for.
//
// Any other answer leaves the dispute standing. The intent is then stored
// expired over the void. Its outcome is unknown, it is never sent again,
// and a later Settle or Reconcile asks the server. If even that write
// fails, the void stays stored. This Client then never reads it: it
// remembers what overrules it, and writes that at the next read
// (overrulingStore). A restart forgets it.
func (c *Client) arbitrate(ctx context.Context, in *Intent, d *disputedError) error {
	key := d.void.Key
	in.set(d.void)
	var (
		why       error
		confirmed *persist.Record // the answer, once the server's lookup holds the key
	)
	if c.lookup == nil {
		why = errors.New("with no lookup (Server.Lookup) nothing tells which is true")
	} else {
		rec, _, err := c.lookupOnce(detached(ctx), d.void, key, c.lookup(in.Request(), key), func() time.Duration { return 0 })
		switch {
		case err != nil:
			why = fmt.Errorf("the lookup settled nothing: %w", err)
		case rec.State == persist.StateVoid:
			// The answer was not the server's: a front on the path made it.
			c.log(ctx, slog.LevelWarn, "idem: an answer in the server's name was not the server's: its lookup has no record of the key", "key", key)
			return &adoptedError{rec: d.void}
		default:
			answer := *d.answer
			answer.UpdatedAt = c.clock.Now()
			if why = c.saveOverVoid(detached(ctx), in, &answer, "record arbitration"); why == nil {
				return nil
			}
			confirmed = &answer
		}
	}
	unsettled := *d.answer
	unsettled.State, unsettled.Response, unsettled.UpdatedAt = persist.StateExpired, nil, c.clock.Now()
	if err := c.saveOverVoid(detached(ctx), in, &unsettled, "record dispute"); err != nil {
		why = errors.Join(why, err)
		if confirmed == nil {
			confirmed = &unsettled
		}
		c.keys.overrule(confirmed)
		// The intent tells the word the Client holds, never the void.
		in.set(confirmed)
	}
	return fmt.Errorf("idem: intent %s got an answer, but another Client stored it void meanwhile; settle it later (Settle or Reconcile): %w: %w", key, ErrOutcomeUnknown, why)
}

// lookupRequest makes the lookup of the intent whose stored record is cur.
// It returns the nonce the answer must echo. cut names an error of the
// lookup's own limit.
func (c *Client) lookupRequest(ctx context.Context, cur *persist.Record, key, lookupURL string, cut func(error) error) (*http.Request, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, lookupURL, nil)
	if err != nil {
		return nil, "", fmt.Errorf("idem: bad lookup URL: %w", err)
	}
	// The lookup acts for the intent's caller. The server answers a
	// stranger's lookup with a miss (see lookupHeader).
	if req.Header, err = c.lookupHeader(ctx, cur.Header, key); err != nil {
		return nil, "", fmt.Errorf("idem: reconciling intent %s: nothing was asked, nothing changes: %w: %w", key, ErrOutcomeUnknown, cut(err))
	}
	// A cache on the path must ask the server, not answer from what it
	// kept. A "not found" kept from before the payment would void it.
	req.Header.Set("Cache-Control", "no-cache")
	// A cache that keeps the answer anyway replays another lookup's
	// nonce, or none. So its miss voids nothing (see lookupNonceHeader).
	nonce := lookupNonce()
	req.Header.Set(lookupNonceHeader, nonce)
	// A second nonce that no server sends back, as a send's attempts carry.
	// An answer that carries it copied the request's header fields: the
	// lookup nonce's echo in it is forged (reflected).
	req.Header.Set(attemptNonceHeader, lookupNonce())
	return req, nonce, nil
}

// lookupAnswer sends the lookup and reads its answer.
func (c *Client) lookupAnswer(req *http.Request, key string, cut func(error) error) (*Response, error) {
	// A GET never carries a key, since the lookup is idempotent. A
	// redirect is not followed. The page it leads to, such as a login
	// page, is not the lookup's answer. A 3xx settles nothing.
	lookup := *c.http
	lookup.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := lookup.Do(req)
	if err != nil {
		return nil, fmt.Errorf("idem: reconciling intent %s: %w: %w", key, ErrOutcomeUnknown, cut(err))
	}
	// An answer over Server.MaxResponseBytes is the server's word all the
	// same, as a send's final answer is. Its header fields count toward
	// the limit. Its status settles, without its body. Asking again would
	// only get it again.
	var body []byte
	oversized := false
	if limit := c.maxBody - headerBytes(resp.Header); limit < 0 {
		resp.Body.Close()
		oversized = true
	} else if body, err = readBody(resp.Body, limit); errors.Is(err, errBodyTooLarge) {
		body, oversized = nil, true
	} else if err != nil {
		return nil, fmt.Errorf("idem: reconciling intent %s: reading the answer: %w: %w", key, ErrOutcomeUnknown, cut(err))
	}
	return &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Oversized: oversized}, nil
}

// judgeLookup sets in rec what the lookup's answer out says of the intent.
// Or it returns why the answer settles nothing, with what to return. wait
// is how much longer an attempt may still arrive.
func (c *Client) judgeLookup(rec *persist.Record, out *Response, key, lookupURL, nonce string, wait time.Duration) (*Response, error) {
	resp, body := out, out.Body
	switch {
	case isSuccess(resp.StatusCode) && c.lookupTrusted(resp.StatusCode, resp.Header, body, key, nonce):
		rec.State = persist.StateSucceeded
		// The caller owns out; the record keeps its own copy.
		rec.Response = c.stored(out)
	case !reflected(resp.Header) && (isKeyUnused(resp.StatusCode, resp.Header, body) ||
		resp.StatusCode == http.StatusNotFound && c.ownAnswer != nil && c.ownAnswer(out.clone(), key)):
		if !echoesNonce(resp.Header, nonce) {
			// A miss kept by a cache may be older than the payment. A CDN
			// that caches everything keeps one. Only a miss made for this
			// lookup is the server's word now.
			return out, fmt.Errorf("idem: the lookup's miss for intent %s does not echo this lookup's nonce (%s): a cache may have kept it from before the payment; nothing changes, reconcile later: %w",
				key, lookupNonceHeader, ErrOutcomeUnknown)
		}
		// An expired intent waits too. An attempt sent just before
		// expiry may arrive as late as any other.
		if wait > 0 {
			return nil, fmt.Errorf("idem: the server has no effect for intent %s yet, but an attempt of it may still be on its way; reconcile again in %s: %w",
				key, wait.Round(time.Millisecond), ErrOutcomeUnknown)
		}
		rec.State = persist.StateVoid
		rec.Response = nil
	case retryableStatus(resp.StatusCode):
		// A 409 says the server holds the key in progress. It may be a
		// dead worker's, with a provider charge it has yet to record. A
		// 503 and the like say it cannot tell now. Neither settles. Do
		// lets the server finish the work, or a later lookup may tell.
		return out, fmt.Errorf("idem: the server cannot settle intent %s now (%d %s); settle it later (Settle sends it again while it may be sent, else asks the lookup): %w: %w",
			key, resp.StatusCode, http.StatusText(resp.StatusCode), ErrOutcomeUnknown,
			&APIError{Method: http.MethodGet, URL: lookupURL, Key: key, StatusCode: resp.StatusCode, Problem: parseProblem(resp.Header, body), Response: out})
	default:
		// This is not the server's word on the key. It may be a CDN's or
		// an ingress's own 404, or a single-page app's index.html. It may
		// be a gateway's 401, or a 2xx without the echo. It settles
		// nothing.
		return out, fmt.Errorf("idem: the lookup's answer for intent %s (%d %s) is not the server's word on its key (a 2xx without the Idempotency-Key echo or this lookup's nonce, a 404 without the typed miss); nothing changes, reconcile later: %w: %w",
			key, resp.StatusCode, http.StatusText(resp.StatusCode), ErrOutcomeUnknown,
			&APIError{Method: http.MethodGet, URL: lookupURL, Key: key, StatusCode: resp.StatusCode, Problem: parseProblem(resp.Header, body), Response: out})
	}
	return nil, nil
}

// recordLookup stores what the lookup settled, and returns its answer.
func (c *Client) recordLookup(ctx context.Context, in *Intent, rec *persist.Record, out *Response, key string) (*Response, error) {
	now := c.clock.Now()
	rec.UpdatedAt = now
	c.log(ctx, slog.LevelInfo, "idem: reconciled", "key", key, "state", string(rec.State))
	err := c.save(context.WithoutCancel(ctx), in, rec, "record reconciliation")
	if d := disputed(err); d != nil {
		// Another Client voided the intent while the lookup was on its
		// way. This lookup's answer is newer, and the server's word: an
		// attempt landed after the void's miss. It is written over the
		// void, once.
		over := *rec
		in.set(d.void)
		if err = c.saveOverVoid(context.WithoutCancel(ctx), in, &over, "record reconciliation"); err != nil {
			// The void stays stored. This Client never reads it, and the
			// intent tells the server's word.
			c.keys.overrule(&over)
			in.set(&over)
		}
	}
	if err != nil {
		if errors.As(err, new(*adoptedError)) {
			// Another call resolved it while the lookup ran. The stored
			// word stands.
			return c.adopted(err)
		}
		// The store still holds the intent unresolved. The server's
		// answer is returned, marked as not recorded, as Do returns one.
		// A void is not the server's answer. So the outcome the app can
		// rely on is unknown.
		if rec.Response != nil {
			out.NotRecorded = true
			return out, err
		}
		return out, fmt.Errorf("idem: the server has no effect for intent %s, but the store could not record it void; the intent stays unresolved: %w: %w", key, ErrOutcomeUnknown, err)
	}
	c.keys.forget(key)
	return out, nil
}
