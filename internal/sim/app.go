package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// An app is a checkout screen. The user fills a cart and presses Pay; the
// app makes an intent for the cart and sends it. A session is one
// checkout: the carts the user tried until one was paid. The user may
// change the cart (a new intent, which idem refuses while the previous one
// may have been charged), press Pay again after an unknown outcome, or
// come back after a restart, when the app resumes what is unresolved.

// cart is one version of a checkout's cart.
type cart struct {
	sess     *session
	desc     string // unique in the world: "d3/shop/s5/c2"
	amount   int64
	customer string
}

// session is one checkout: at most one of its carts may be charged. The
// app keeps it in its own storage, which survives a crash: the carts and
// the keys of the intents it learnt of.
type session struct {
	id    string
	carts []*cart
	keys  []string
	paid  bool // as the app knows it
	// forced: the app made a deliberate new payment for the session with
	// NewIntent. Each Client keeps such an intent in memory until it is
	// armed; arming both is two deliberate payments, so a double tap split
	// across two Clients is not tried then.
	forced bool
}

type app struct {
	d     *device
	name  string
	sess  *session
	nSess int
	// outbox holds requests HTTPRequest handed out that the app sends at
	// its next action; it is in memory, and lost when the device dies.
	outbox []handedOut
}

// handedOut is a request the app holds to send later, its intent, and when
// HTTPRequest handed it out.
type handedOut struct {
	cl  *idem.Client
	in  *idem.Intent
	req *http.Request
	at  time.Time
}

// outboxLife is how long the app keeps a handed-out request to send: well
// within the shortest time a server of the world keeps a key, as
// HTTPRequest's doc asks. Past it, the app drops the request unsent.
const outboxLife = 10 * time.Minute

func (a *app) newSession() {
	a.nSess++
	a.sess = &session{id: fmt.Sprintf("d%d/%s/s%d", a.d.id, a.name, a.nSess)}
	a.d.w.sessions = append(a.d.w.sessions, a.sess)
	a.newCart()
}

func (a *app) newCart() {
	r := a.d.w.appRNG
	c := &cart{sess: a.sess, desc: fmt.Sprintf("%s/c%d", a.sess.id, len(a.sess.carts)+1), amount: 100 + r.Int64N(10000), customer: "cus_ok"}
	if r.chance(0.1) {
		c.customer = declinedCustomer
	}
	a.sess.carts = append(a.sess.carts, c)
	a.d.w.carts[c.desc] = c
}

func (c *cart) request() idem.Request {
	req, err := idem.JSONRequest(http.MethodPost, baseURL+"/payments", map[string]any{
		"amount": c.amount, "currency": "AZN", "customer": c.customer, "description": c.desc,
	})
	if err != nil {
		panic(err)
	}
	return req
}

// step is one user action in the app. The checkout screen first shows the
// outcome of the session's intents (one may have gone through while the app
// was not looking: the app died after Do saved it). Intents are made only
// when Pay is pressed: one made when the screen is shown would be resumed
// after a restart even if the user had changed the cart.
func (a *app) step() {
	// The app sends what its outbox holds before the user's action, or
	// after it: the action may settle or reconcile the intent first. (A
	// device that dies in the action loses the outbox.)
	before := a.d.w.appRNG.chance(0.5)
	if before {
		a.flushOutbox()
	}
	a.userAction()
	if !before {
		a.flushOutbox()
	}
}

// userAction is what the user does on the checkout screen.
func (a *app) userAction() {
	w := a.d.w
	r := w.appRNG
	if a.sess != nil && a.sess.paid && w.cfg.Faults[faultClockDays] && r.chance(0.1) {
		// The user taps Pay again on the paid cart: a no-op, whatever
		// Prune has removed since.
		a.pay(a.sess.carts[len(a.sess.carts)-1])
		return
	}
	if a.sess == nil || a.sess.paid {
		a.newSession()
	}
	for _, key := range a.sess.keys {
		if in, err := a.d.pickClient().Load(context.Background(), key); err == nil {
			w.observe(a, in)
		}
	}
	if a.sess.paid {
		return
	}
	cur := a.sess.carts[len(a.sess.carts)-1]
	if r.chance(0.2) {
		// The Pay screen shows the intent's key; the user walks away.
		// Only a tap may send it.
		in, err := a.d.pickClient().Intent(context.Background(), a.name, cur.request())
		if err == nil && w.intents[in.Key()] == nil {
			w.shown[in.Key()] = true
			w.tracef("d%d/%s: Pay shown for %s (key %s); the user leaves", a.d.id, a.name, cur.desc, in.Key())
		}
		return
	}
	if r.chance(0.15) {
		// The user changes the cart (or the card, after a decline).
		a.newCart()
		w.tracef("d%d/%s: the user changes the cart of %s", a.d.id, a.name, a.sess.id)
		return
	}
	if len(a.sess.keys) == 0 && r.chance(w.cfg.Faults.rate(faultOuterRetry)) {
		// A checkout nothing has paid yet goes, at times, through the
		// app's API client.
		a.payThroughRoundTripper(cur)
		return
	}
	a.pay(cur)
}

// payThroughRoundTripper is the Pay button of an app whose API client
// sends its requests through Client.RoundTripper and retries on its own:
// after an error it sends the same *http.Request again, a few times. Half
// of such API clients set an http.Client Timeout, under which net/http
// sends a copy of the request. The checkout then moves on. The intent the
// RoundTripper made under the API client's key lives in memory, for the
// call alone: nothing settles it after. (The real mode's totals check
// leaves its charge out.)
func (a *app) payThroughRoundTripper(c *cart) {
	w := a.d.w
	r := w.appRNG
	// The app's storage notes at once that the checkout moved to the API
	// client: whatever becomes of the call, crash included, Pay is not
	// pressed for this cart again, as the intent has no action of idem's.
	a.sess = nil
	var rt http.RoundTripper = a.d.pickClient().RoundTripper(w.parts.network(a.d))
	if r.chance(0.5) {
		// An auth layer on top, that sets its token on a clone of each
		// request: the clone is the same request.
		rt = cloningAuth{rt}
	}
	hc := &http.Client{Transport: rt}
	if r.chance(0.5) {
		// Never reached: the world's requests take no real time. It only
		// makes net/http copy the request.
		hc.Timeout = time.Hour
	}
	cr := c.request()
	req, err := http.NewRequest(cr.Method, cr.URL, bytes.NewReader(cr.Body))
	if err != nil {
		panic(err)
	}
	req.Header = cr.Header.Clone()
	// The API client states the request's identity as Stripe's SDKs do:
	// its own key, made once for the checkout and sent on each of its
	// tries. The RoundTripper refuses a POST that states none.
	req.Header.Set("Idempotency-Key", fmt.Sprintf(apiKeyPrefix+"%d-%s-%d", a.d.id, a.name, r.Int64N(1<<62)))
	if hc.Timeout > 0 {
		// The goroutine net/http starts for the Timeout ends when the call
		// does, or here if the device dies in the middle of it.
		done := make(chan struct{})
		defer close(done)
		req.Cancel = done //lint:ignore SA1019 the only way to end the Timeout's goroutine when a crash unwinds the call
	}
	tries := 1 + r.IntN(4)
	for i := range tries {
		resp, err := hc.Do(req)
		w.tracef("d%d/%s: API client try %d/%d for %s: err %v", a.d.id, a.name, i+1, tries, c.desc, err)
		if err != nil {
			w.stats.fault(faultOuterRetry.Name())
			continue
		}
		resp.Body.Close()
		break
	}
}

// apiKeyPrefix begins the keys the app's own API client makes.
const apiKeyPrefix = "api-"

// pay is the Pay button for c.
func (a *app) pay(c *cart) {
	w := a.d.w
	cl := a.d.pickClient()
	ctx := context.Background()
	in, err := cl.Intent(ctx, a.name, c.request())
	var ue *idem.UnresolvedError
	w.tracef("d%d/%s: Pay for %s: Intent err %v", a.d.id, a.name, c.desc, err)
	if errors.As(err, &ue) {
		// An earlier cart may have been charged: settle it first, by
		// resuming it or by asking the server.
		prev := ue.Previous
		if w.appRNG.chance(0.5) {
			a.settle(cl, prev, true)
		} else {
			a.reconcile(cl, prev)
		}
		return
	}
	var paid *idem.ResolvedError
	if errors.As(err, &paid) {
		if slices.Contains(a.sess.keys, paid.Previous.Key()) {
			// This purchase is paid, under another cart of it.
			w.observe(a, paid.Previous)
			return
		}
		// The action's earlier purchase is paid: this one is a
		// deliberate new payment.
		in, err = cl.NewIntent(ctx, a.name, c.request())
		a.sess.forced = true
	}
	if err != nil {
		return
	}
	w.bind(in.Key(), c)
	switch in.State() {
	case persist.StateSucceeded:
		w.observe(a, in)
		return
	case persist.StateVoid, persist.StateRejected:
		// Nothing was charged for it: pay again under a new key.
		in, err = cl.NewIntent(ctx, a.name, c.request())
		if err != nil {
			return
		}
		w.bind(in.Key(), c)
	case persist.StateFailed:
		// Declined: the user must change the card.
		w.observe(a, in)
		a.newCart()
		return
	}
	// Nothing can have sent it yet: if nothing of this call leaves the
	// device either, the user must be told "not sent", not be blocked.
	// That holds for an intent stored not sent, or one this tap makes. An
	// intent stored armed (new) was armed by an earlier process or the
	// other Client, which may have sent it before it died: armed means
	// maybe sent, and idem cannot tell otherwise.
	// A write of it that failed may have armed it, the same.
	armed, _ := a.d.mem.Get(ctx, in.Key())
	fresh := in.State() == persist.StateNotSent || in.State() == persist.StateNew && armed == nil
	fresh = fresh && !w.intents[in.Key()].storeFailed
	// A double tap split across the two Clients of the device: the second
	// tap's intent is made before the first is armed.
	var other *idem.Client
	var in2 *idem.Intent
	if a.d.client2 != nil && !a.sess.forced && w.appRNG.chance(0.3) {
		other = a.d.client
		if cl == other {
			other = a.d.client2
		}
		w.stats.fault(faultTwoClients.Name() + " (split taps)")
		if in2, err = other.Intent(ctx, a.name, c.request()); err != nil {
			in2 = nil
		}
		w.tracef("d%d/%s: a second tap on the other Client: intent %v, err %v", a.d.id, a.name, in2 != nil, err)
	}
	if w.faulty && w.appRNG.chance(w.cfg.Faults.rate(faultHandOut)) {
		a.handOut(cl, in)
		return
	}
	written := w.parts.written(a.d)
	err = a.settle(cl, in, true)
	var re *idem.RetryError
	// A not-sent write that failed did not make the intent not sent: the
	// call says the outcome is unknown, with the store's error, and that
	// is the rule, not a block.
	if fresh && w.parts.written(a.d) == written && errors.As(err, &re) && re.Attempts > 0 && !errors.As(err, new(*idem.SaveError)) {
		w.blocked = append(w.blocked, fmt.Sprintf("intent %s for cart %s: no request of it left the device, yet its outcome is unknown (%s): a changed cart is refused", in.Key(), c.desc, re.Reason))
	}
	if in2 != nil {
		w.bind(in2.Key(), c)
		a.settle(other, in2, true)
	}
}

// handOut is a Pay button whose app sends the intent's exact request
// through an http.Client of its own (Client.HTTPRequest). The answer is
// not recorded: the checkout's next step asks idem, which settles the
// intent from the server's record. The app tells the Client when its send
// ended, unless it dies first.
func (a *app) handOut(cl *idem.Client, in *idem.Intent) {
	w := a.d.w
	ctx := context.Background()
	w.userAsks(in.Key())
	req, err := cl.HTTPRequest(ctx, in)
	w.tracef("d%d/%s: HTTPRequest for %s: err %v", a.d.id, a.name, in.Key(), err)
	if err != nil {
		w.noteStoreFailure(in.Key(), err)
		return
	}
	w.stats.fault(faultHandOut.Name())
	h := handedOut{cl: cl, in: in, req: req, at: w.parts.now()}
	if w.appRNG.chance(0.5) {
		// The app queues it in an outbox of its own, and sends it at
		// its next action.
		a.outbox = append(a.outbox, h)
		w.tracef("d%d/%s: the app holds the request of %s in its outbox", a.d.id, a.name, in.Key())
		return
	}
	a.sendHandedOut(h)
}

// sendHandedOut sends a request HTTPRequest handed out through the app's
// own http.Client, and tells the Client when the send ended, unless the
// device dies first.
func (a *app) sendHandedOut(h handedOut) {
	w := a.d.w
	ctx := context.Background()
	cl, in, req := h.cl, h.in, h.req
	hc := &http.Client{Transport: w.parts.network(a.d)}
	resp, err := hc.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		w.tracef("d%d/%s: the app's own send of %s gets %d", a.d.id, a.name, in.Key(), resp.StatusCode)
	} else {
		w.tracef("d%d/%s: the app's own send of %s fails: %v", a.d.id, a.name, in.Key(), err)
	}
	if w.appRNG.chance(0.7) {
		err := cl.SendEnded(ctx, in)
		w.tracef("d%d/%s: SendEnded %s: err %v", a.d.id, a.name, in.Key(), err)
	}
}

// flushOutbox sends the requests the app held, or drops those older than
// outboxLife.
func (a *app) flushOutbox() {
	w := a.d.w
	out := a.outbox
	a.outbox = nil
	for _, h := range out {
		if w.parts.now().Sub(h.at) > outboxLife {
			w.tracef("d%d/%s: the app drops the stale request of %s from its outbox", a.d.id, a.name, h.in.Key())
			_ = h.cl.SendEnded(context.Background(), h.in)
			continue
		}
		a.sendHandedOut(h)
	}
}

// pickClient is the Client a part of the app holds: either of two on a
// device that runs two.
func (d *device) pickClient() *idem.Client {
	if d.client2 != nil && d.w.appRNG.chance(0.5) {
		return d.client2
	}
	return d.client
}

// settle sends in (resuming it) and, once it is too old to send,
// reconciles it. asks says the user asked for it (pressed Pay): only that
// may send an intent the app was told was not sent.
func (a *app) settle(cl *idem.Client, in *idem.Intent, asks bool) error {
	if asks {
		a.d.w.userAsks(in.Key())
	}
	w := a.d.w
	written := w.parts.written(a.d)
	resp, err := cl.Do(context.Background(), in)
	a.d.w.tracef("d%d/%s Do %s: state %s, err %v", a.d.id, a.name, in.Key(), in.State(), err)
	a.d.w.noteStoreFailure(in.Key(), err)
	a.d.w.toldNotSent(in.Key(), err)
	a.d.w.observe(a, in)
	a.d.w.observeAnswer(a, in.Key(), resp, err, w.parts.written(a.d)-written)
	if in.State() == persist.StateExpired {
		a.reconcile(cl, in)
	}
	return err
}

func (a *app) reconcile(cl *idem.Client, in *idem.Intent) {
	_, err := cl.Reconcile(context.Background(), in)
	a.d.w.tracef("d%d/%s Reconcile %s: state %s, err %v", a.d.id, a.name, in.Key(), in.State(), err)
	if in.State() == persist.StateVoid && err != nil {
		// "Never done" holds only once it is saved: the store still
		// says unresolved and the next Do sends the intent again. An app
		// that checks the error does not tell the user "not paid".
		return
	}
	a.d.w.observe(a, in)
}

// resume is what the app does when it starts: settle every unresolved
// intent, by resuming it or, at times, by asking the server first (an app
// that would rather not send an old payment again unasked). An intent the
// app was told was not sent is left until the user presses Pay again, as
// SettleAll leaves it.
func (d *device) resume() {
	switch {
	case d.w.cfg.Faults[faultClockDays] && !d.w.faulty:
		// Once the world is calm the app only settles.
	case d.w.cfg.Faults[faultClockDays]:
		// idem's Prune keeps what makes the next tap of a paid action a
		// no-op, whatever the device clock says; the app taps paid carts
		// again (see step).
		n, err := d.pickClient().Prune(context.Background(), pick(d.w.appRNG, time.Hour, 24*time.Hour))
		d.w.tracef("d%d: Prune removes %d, err %v", d.id, n, err)
	default:
		d.prune()
	}
	if d.w.faulty && d.w.appRNG.chance(d.w.cfg.Faults.rate(faultSettleAllRace)) {
		d.w.stats.fault(faultSettleAllRace.Name())
		d.settleAllRacingTaps()
		return
	}
	ins, _ := d.client.Unresolved(context.Background())
	for _, in := range ins {
		a := d.appNamed(in.Name())
		d.w.bindIntent(in)
		if in.State() == persist.StateNotSent {
			continue
		}
		if d.w.faulty && d.w.appRNG.chance(0.5) {
			a.reconcile(d.client, in)
			if in.State().Resolved() {
				continue
			}
		}
		a.settle(d.client, in, false)
	}
}

// settleAllRacingTaps is an app that settles its intents at start with
// SettleAll, while the user taps Pay: between two of SettleAll's settles,
// from the list it took first, the user may act. A tap that ends "not
// sent" is a promise SettleAll must keep for the intents it listed.
func (d *device) settleAllRacingTaps() {
	w := d.w
	ins, _ := d.client.Unresolved(context.Background())
	for _, in := range ins {
		w.bindIntent(in)
	}
	// A crash in the user's action ends SettleAll (its context) and then
	// the process, as the crash unwinds.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var died any
	written := w.parts.written(d)
	d.settled = func(s idem.Settled, done int) {
		key := s.Intent.Key()
		a := d.appNamed(s.Intent.Name())
		w.tracef("d%d/%s SettleAll %s: state %s, err %v", d.id, a.name, key, s.Intent.State(), s.Err)
		w.noteStoreFailure(key, s.Err)
		w.toldNotSent(key, s.Err)
		w.observe(a, s.Intent)
		w.observeAnswer(a, key, s.Response, s.Err, w.parts.written(d)-written)
		if died != nil || !w.appRNG.chance(0.5) {
			written = w.parts.written(d)
			return
		}
		func() {
			defer func() {
				if v := recover(); v != nil {
					if _, ok := v.(crash); !ok {
						panic(v)
					}
					died = v
					cancel()
				}
			}()
			// Often the user taps Pay on the action SettleAll sends
			// next, at times while the radio is down: that tap ends
			// "not sent", a promise SettleAll must keep.
			u := pick(w.appRNG, d.apps...)
			if done < len(ins) && w.appRNG.chance(0.5) {
				u = d.appNamed(ins[done].Name())
			}
			w.tracef("d%d/%s: the user acts while SettleAll runs", d.id, u.name)
			if w.appRNG.chance(0.5) {
				defer w.parts.radioDown(d, time.Hour)()
				w.tracef("d%d: the radio is down during the user's action", d.id)
			}
			u.step()
		}()
		written = w.parts.written(d)
	}
	defer func() { d.settled = nil }()
	_, _ = d.client.SettleAll(ctx)
	if died != nil {
		panic(died)
	}
}

// prune deletes the resolved intents older than a day whose outcome the
// app has shown, as an app keeps its store small. (persist.Prune by age
// alone would also delete an outcome that Do saved just before the app
// died, before the app could show it: the user would then pay again.)
func (d *device) prune() {
	ctx := context.Background()
	recs, _ := d.store.List(ctx, persist.Filter{})
	before := d.w.parts.clock(d).Now().Add(-24 * time.Hour)
	for _, rec := range recs {
		info := d.w.intents[rec.Key]
		if rec.State.Resolved() && rec.UpdatedAt.Before(before) && info != nil && info.reported != "" {
			if d.store.Delete(ctx, rec) != nil {
				return
			}
		}
	}
}

func (d *device) appNamed(name string) *app {
	if name == "" {
		// An intent the RoundTripper made: its action has no name.
		return d.apps[0]
	}
	for _, a := range d.apps {
		if a.name == name {
			return a
		}
	}
	panic("sim: intent for an unknown app " + name)
}

// cloningAuth is an API client's auth transport: it sets its token on a
// clone of each request, as oauth2.Transport does.
type cloningAuth struct{ base http.RoundTripper }

func (t cloningAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	clone := req.Clone(req.Context())
	clone.Header.Set("X-Client-Token", "sim") // the network names the device in Authorization
	return t.base.RoundTrip(clone)
}
