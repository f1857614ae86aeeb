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
// unknown, without sending it again: a GET of the URL the lookup set with
// Server.Lookup returns for the intent (for the fake server and APIs like it,
// GET /payments?idempotency_key=K). It is the way to settle an expired
// intent, or one the app no longer wants to resume; Settle calls it when
// sending again is no longer safe. Without a lookup it returns an error
// and changes nothing.
//
// The lookup acts for the intent's caller, as its attempts did: a server
// scopes keys by caller, and answers a stranger with a miss. It carries
// the intent's stored header fields, but those of the body (Content-*,
// Digest) and the intent's preconditions (If-*). It carries
// Config.Authorizer's credentials for the key, asked fresh. An Authorizer
// that fails ends Reconcile with an error matching ErrOutcomeUnknown that
// wraps the failure: nothing is sent, and nothing changes.
//
// Only the server's word settles the intent (see the package
// documentation, "Whose word settles an intent"):
//
//   - 2xx that echoes the intent's key (Idempotency-Key), or that
//     Server.Mark recognises by the key in its body (MarkIncrease), or
//     that another recognizer recognises and that echoes this lookup's
//     nonce without an Age field: the work was done; the intent becomes
//     succeeded, with the lookup's answer stored as its response. A 2xx
//     that echoes another key or another lookup's nonce is another
//     lookup's answer, kept by a cache that ignores the query string.
//   - 404 whose body is the lookup's typed miss (a problem of type
//     https://idem.dev/problems/idempotency-key-unused), or that
//     Server.Mark recognises, that echoes the fresh nonce this
//     lookup sent (Idempotency-Lookup-Nonce; a miss a cache kept does
//     not), once no attempt of the intent can still arrive: the work was
//     never done; the intent becomes void and a new intent for the action
//     may be created. An attempt may arrive up to the reconcile delay
//     (Server.ReconcileDelay) after it was last written, which was, at the
//     latest: never, for an intent this Client armed and never sent; the
//     end of this Client's last call of it, if it sent it and still holds
//     it; otherwise the send deadline its holder stored with its claim
//     (the latest time the claiming call may begin a send), and never
//     before this Client's creation. An expired intent waits like any other: the
//     expiry write moves no deadline. The wait is the smallest time any
//     clock says passed (the in-process timeline, which no setting of the
//     wall clock moves; the wall clock; the clock that counts sleep).
//   - 404 sooner than that: an attempt may still be on its way, so
//     Reconcile returns an error matching ErrOutcomeUnknown that says how
//     long to wait, and changes nothing. Try again later.
//   - 409 (the server holds the key in progress), 503 and the other
//     retryable answers: an error matching ErrOutcomeUnknown, and nothing
//     changes: resume the intent with Do or reconcile later.
//   - Anything else is "cannot tell yet": an error matching
//     ErrOutcomeUnknown that wraps an *APIError with the answer, and
//     nothing changes. That includes any other 404 (a CDN's page, a
//     wrong path), a 2xx without the echo (a single-page app's
//     index.html), a 401, 403 or 407 of a gateway, and a redirect,
//     which is not followed: a lookup sent to a login page would get
//     the page's 200. Give the lookup's final URL. The echo alone never
//     voids an intent: a gateway that copies request header fields into
//     its answers could forge it.
//
// The lookup's answer is returned; in.State() tells what was concluded.
// While Reconcile runs, a Do of the same intent waits and then reads what
// Reconcile concluded; Reconcile itself returns ErrInFlight if a Do for the
// intent is running.
// A resolved intent is returned as it is, and nothing is sent. The lookup
// takes at most RetryPolicy.MaxElapsed, the call's (ContextWithRetryPolicy)
// or else the Client's; one that gets no answer in time
// is an error matching ErrOutcomeUnknown, and nothing changes.
func (c *Client) Reconcile(ctx context.Context, in *Intent) (*Response, error) {
	if in == nil {
		return nil, errors.New("idem: Reconcile with a nil intent")
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
	// Holding the key keeps a Do from sending while the lookup decides,
	// and its save from racing this one's.
	if !c.flights.exclusive(key, func() { resp, err = c.askLookup(ctx, in, key, lookupURL) }) {
		return nil, fmt.Errorf("%w: %s; reconcile it when the Do returns", ErrInFlight, key)
	}
	return resp, err
}

// askLookup is Reconcile's body, run while no call of key runs in this
// Client: it asks the server's lookup at lookupURL what became of key, and
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
	next := *cur
	rec := &next

	// The lookup is one request: RetryPolicy.MaxElapsed bounds it, in real
	// time, whatever the http.Client's Timeout.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.policyFor(ctx).MaxElapsed)
	defer cancel()
	// An error of the lookup's own limit is the budget's, not the
	// caller's deadline; the URL net/http's error names carries no
	// credential.
	cut := func(err error) error {
		err = redactErr(err)
		if ctx.Err() != nil && parent.Err() == nil {
			return &budgetSpent{reason: stopElapsed, err: err}
		}
		return err
	}
	req, nonce, err := c.lookupRequest(ctx, cur, key, lookupURL, cut)
	if err != nil {
		return nil, err
	}
	// Whether an attempt may still arrive is decided as the lookup leaves:
	// its answer tells the server's state from then on, and an attempt
	// that arrives while the lookup is on its way is not in it.
	// A request in the app's hands (HTTPRequest) may be sent up to the
	// send deadline its hand-out stored: the server's retention from
	// then, or the end the app reported (SendEnded).
	wait := c.keys.mayStillArrive(key, c.clocks.read(), c.clocks.birth, c.reconcile, cur, c.id)
	out, err := c.lookupAnswer(req, key, cut)
	if err != nil {
		return nil, err
	}
	if resp, err := c.judgeLookup(rec, out, key, lookupURL, nonce, wait); err != nil {
		return resp, err
	}
	return c.recordLookup(ctx, in, rec, out, key)
}

// lookupRequest makes the lookup of the intent whose stored record is cur,
// with the nonce its answer must echo. cut names an error of the lookup's
// own limit.
func (c *Client) lookupRequest(ctx context.Context, cur *persist.Record, key, lookupURL string, cut func(error) error) (*http.Request, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, lookupURL, nil)
	if err != nil {
		return nil, "", fmt.Errorf("idem: bad lookup URL: %w", err)
	}
	// The lookup acts for the intent's caller: the server answers a
	// stranger's lookup with a miss (see lookupHeader).
	if req.Header, err = c.lookupHeader(ctx, cur.Header, key); err != nil {
		return nil, "", fmt.Errorf("idem: reconciling intent %s: nothing was asked, nothing changes: %w: %w", key, ErrOutcomeUnknown, cut(err))
	}
	// A cache on the path must ask the server, not answer from what it
	// kept: a "not found" kept from before the payment would void it.
	req.Header.Set("Cache-Control", "no-cache")
	// A cache that keeps the answer anyway replays another lookup's
	// nonce, or none: its miss voids nothing (see lookupNonceHeader).
	nonce := lookupNonce()
	req.Header.Set(lookupNonceHeader, nonce)
	return req, nonce, nil
}

// lookupAnswer sends the lookup and reads its answer.
func (c *Client) lookupAnswer(req *http.Request, key string, cut func(error) error) (*Response, error) {
	// Never a key on GET: the lookup is naturally idempotent. A redirect
	// is not followed: the page it leads to (a login page, say) is not the
	// lookup's answer, and a 3xx settles nothing.
	lookup := *c.http
	lookup.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := lookup.Do(req)
	if err != nil {
		return nil, fmt.Errorf("idem: reconciling intent %s: %w: %w", key, ErrOutcomeUnknown, cut(err))
	}
	// An answer over Server.MaxResponseBytes, header fields included, is
	// the server's word all the same, as a send's final answer is: its
	// status settles, without its body (asking again would get it again).
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

// judgeLookup sets in rec what the lookup's answer out says of the intent,
// or returns why it settles nothing, with what to return. wait is how much
// longer an attempt may still arrive.
func (c *Client) judgeLookup(rec *persist.Record, out *Response, key, lookupURL, nonce string, wait time.Duration) (*Response, error) {
	resp, body := out, out.Body
	switch {
	case isSuccess(resp.StatusCode) && c.lookupTrusted(resp.StatusCode, resp.Header, body, key, nonce):
		rec.State = persist.StateSucceeded
		// The caller owns out; the record keeps its own copy.
		rec.Response = c.stored(out)
	case isKeyUnused(resp.StatusCode, resp.Header, body) ||
		resp.StatusCode == http.StatusNotFound && c.ownAnswer != nil && c.ownAnswer(out.clone(), key):
		if !echoesNonce(resp.Header, nonce) {
			// A miss kept by a cache (a CDN that caches everything) may
			// be older than the payment: only a miss made for this
			// lookup is the server's word now.
			return out, fmt.Errorf("idem: the lookup's miss for intent %s does not echo this lookup's nonce (%s): a cache may have kept it from before the payment; nothing changes, reconcile later: %w",
				key, lookupNonceHeader, ErrOutcomeUnknown)
		}
		// Expired or not: an attempt sent just before expiry may arrive
		// as late as any other.
		if wait > 0 {
			return nil, fmt.Errorf("idem: the server has no effect for intent %s yet, but an attempt of it may still be on its way; reconcile again in %s: %w",
				key, wait.Round(time.Millisecond), ErrOutcomeUnknown)
		}
		rec.State = persist.StateVoid
		rec.Response = nil
	case retryableStatus(resp.StatusCode):
		// 409: the server holds the key in progress (perhaps a dead
		// worker's, with a provider charge it has yet to record); 503 and
		// the like: it cannot tell now. Either way, not settled: resume
		// with Do, which lets the server finish the work, or try later.
		return out, fmt.Errorf("idem: the server cannot settle intent %s now (%d %s); resume it with Do or reconcile later: %w: %w",
			key, resp.StatusCode, http.StatusText(resp.StatusCode), ErrOutcomeUnknown,
			&APIError{Method: http.MethodGet, URL: lookupURL, Key: key, StatusCode: resp.StatusCode, Problem: parseProblem(resp.Header, body), Response: out})
	default:
		// Not the server's word on the key: a CDN's or an ingress's own
		// 404, a single-page app's index.html, a gateway's 401, a 2xx
		// without the echo. It settles nothing.
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
	if err := c.save(context.WithoutCancel(ctx), in, rec, "record reconciliation"); err != nil {
		if errors.As(err, new(*adoptedError)) {
			// Resolved while the lookup ran: the stored word stands.
			return c.adopted(err)
		}
		// The store still holds the intent unresolved. The server's
		// answer is returned, marked as not recorded, as Do returns one.
		// A void is not the server's answer: the outcome the app can
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
