package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idem/persist"
)

// Send is the one call for a Pay button. It sends req once for the action
// name and returns the final answer. It does so however many attempts,
// crashes and restarts that takes.
//
// It takes the intent Client.Intent gives for name and req, and settles it.
// Settling arms it, its one durable write before the first byte.
//
//   - The first time, a new intent is saved and sent.
//   - The same request again is the same intent. (That may be a second tap,
//     or the next run of the app.) While its outcome is unknown, it is
//     resumed with its key. Once it is resolved, its stored answer is
//     returned with FromStore set. Nothing is sent then. The server's lookup
//     may show the intent was never done. (It is void, or the lookup finds
//     so now, as it is too old to resend.) Then a new intent replaces it and
//     is sent.
//   - A changed request while the previous one's outcome is unknown is
//     refused. The error is *UnresolvedError, and nothing is sent. Settle
//     the previous intent first.
//   - A changed request once the previous one succeeded is refused. (It may
//     be another amount, or the server spelled localhost, not 127.0.0.1.)
//     The error is *ResolvedError, which carries the earlier answer. Nothing
//     is sent, for the action is paid. A deliberate second payment for the
//     action is NewIntent, then Settle.
//
// The errors are those of Do and Settle. A final answer that is not a
// success gives *APIError with the Response. With no final answer yet, the
// error matches ErrOutcomeUnknown. Call Send again later with the same name
// and request. It picks the intent up where it stopped. A foreground tap
// usually wants a short budget. Pass a context from ContextWithRetryPolicy.
func (c *Client) Send(ctx context.Context, name string, req Request) (*Response, error) {
	in, err := c.Intent(ctx, name, req)
	if err != nil {
		return nil, err
	}
	resp, err := c.Settle(ctx, in)
	if err != nil || in.State() != persist.StateVoid {
		return resp, forCall(err, callSend)
	}
	// The server never did it: it was void, or the lookup just found so. A
	// new intent cannot do it twice.
	if in, err = c.NewIntent(ctx, name, req); err != nil {
		return nil, err
	}
	resp, err = c.Settle(ctx, in)
	return resp, forCall(err, callSend)
}

// Settle brings an intent to a final state by the safest means available. It
// returns the intent's answer.
//
//   - A resolved intent returns its stored answer (FromStore) and sends
//     nothing.
//   - The server may still keep the key. (The intent is younger than the
//     retention less the safety margin. See Server.Retention.) Then the
//     intent is sent again with its key and bytes, as Do does. The server
//     does the work at most once and replays its answer.
//   - After that, a resend could do the work twice. So the server's lookup
//     (Server.Lookup) is asked, as Reconcile does. The lookup is asked too
//     after a redirect to another URL. That is when the resend was answered
//     "key reused" there (stopRedirectedKeyReused). The redirected request
//     may have done the work, and only the lookup can tell.
//
// When neither can decide yet, the error matches ErrOutcomeUnknown. It says
// why:
//
//   - The retry budget ran out. Settle again later.
//   - The lookup cannot tell yet, as an attempt may still run on the server.
//   - The intent is too old to send, and the Client has no lookup.
//
// The intent then stays unresolved.
//
// The lookup may show that the intent was never done. Then the intent ends
// void. Settle returns a nil Response and a nil error. in.State() is then
// persist.StateVoid.
func (c *Client) Settle(ctx context.Context, in *Intent) (*Response, error) {
	if !in.made() {
		return nil, errors.New("idem: Settle with a nil or zero intent: " + madeBy)
	}
	resp, err := c.settle(ctx, in, callAsk{tick: c.keys.callTick()})
	return resp, forCall(err, callSettle)
}

// settle is Settle for whoever asks: the app, or SettleAll.
func (c *Client) settle(ctx context.Context, in *Intent, ask callAsk) (*Response, error) {
	if err := checkPolicy(ctx); err != nil {
		return nil, err
	}
	// The tap makes an unarmed intent durable before its first byte.
	if err := c.arm(ctx, in); err != nil {
		return nil, err
	}
	resp, err := c.flights.do(ctx, in.Key(), func() (*Response, error) { return c.doAs(ctx, in, c.retry, nil, ask) })
	switch {
	case err == nil:
		return resp, nil
	case in.State() == persist.StateVoid && !errors.Is(err, ErrOutcomeUnknown):
		// A void stored while the call disputed it is no answer (see
		// arbitrate). The outcome is unknown.
		return nil, nil
	case !endedExpired(err) && !endedOnRedirectedReuse(err):
		return resp, err
	case c.lookup == nil && !endedExpired(err):
		return resp, fmt.Errorf("idem: intent %s may have been done under a URL it was redirected to, and the Client has no lookup to ask the server (Server.Lookup): %w", in.Key(), err)
	case c.lookup == nil:
		return nil, fmt.Errorf("idem: intent %s may not be sent again (too old, or stored expired after a dispute over a void) and the Client has no lookup to ask the server (Server.Lookup): %w", in.Key(), err)
	}
	resp, err = c.Reconcile(ctx, in)
	if err == nil && in.State() == persist.StateVoid {
		return nil, nil
	}
	return resp, err
}

// endedExpired reports an error of a call that ended because the intent may
// no longer be sent.
func endedExpired(err error) bool {
	var re *RetryError
	return errors.As(err, &re) && re.Reason == stopExpired
}

// endedOnRedirectedReuse reports an error of a call that ended on "key
// reused". That answer came after a redirect to another URL. Only the lookup
// can tell what became of the intent.
func endedOnRedirectedReuse(err error) bool {
	var re *RetryError
	return errors.As(err, &re) && re.Reason == stopRedirectedKeyReused
}

// SettleAll settles every unresolved intent in the store, oldest first. It
// settles a few at a time (Config.SettleConcurrency). It reports what became
// of each, and reports each as it ends too (Config.SettleProgress). It is
// the call for app start, after a crash or a restart. Intents whose outcome
// is still unknown stay unresolved for the next SettleAll.
//
// An intent whose last call ended not sent (persist.StateNotSent) is not
// sent. The app told its user so. The app sends it again only when asked
// (Send, Settle or Do). Its Settled.Err matches ErrNotSent, saying so.
//
// Armed intents stored as new are sent too. The first attempt is not
// recorded, so after a crash one may have reached the server. Intents the
// user never tapped were never armed and are not in the store. SettleAll
// never sends them.
//
// The error is that of Unresolved: it names the stored intents it could not
// read. The readable ones are settled anyway. A background settle usually
// wants a long budget. Pass a context from ContextWithRetryPolicy.
func (c *Client) SettleAll(ctx context.Context) ([]Settled, error) {
	if err := checkPolicy(ctx); err != nil {
		return nil, err
	}
	ins, listErr := c.Unresolved(ctx)
	out := make([]Settled, len(ins))
	sem := make(chan struct{}, c.settles.workers)
	progress := newSettleProgress(c.settles.progress, len(ins))
	// settle settles the i-th intent. The check is made again as it is sent,
	// from the record read then (keys.begin). A tap may have ended not sent
	// since the list was read.
	settle := func(i int) {
		resp, err := c.settle(ctx, out[i].Intent, callAsk{background: true})
		out[i].Response, out[i].Err = resp, forCall(err, callSettleAll)
		progress.report(out[i])
	}
	var wg sync.WaitGroup
	for i, in := range ins {
		out[i].Intent = in
		if err := ctx.Err(); err != nil {
			out[i].Err = err
			progress.report(out[i])
			continue
		}
		if c.settles.workers == 1 {
			// One after the other, in the caller's goroutine.
			settle(i)
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			out[i].Err = ctx.Err()
			progress.report(out[i])
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			settle(i)
		}()
	}
	wg.Wait()
	progress.rethrow()
	return out, listErr
}
