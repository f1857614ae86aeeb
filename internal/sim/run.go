package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// config is one run of the world. Zero durations are drawn from the seed.
type config struct {
	Seed uint64
	// Mode chooses the parts: virtual (the default) or real.
	Mode mode
	// Actions is how many user actions the run makes before the world turns
	// calm. Zero means 300.
	Actions int
	// Devices is how many devices take part. Zero means 2 to 6.
	Devices int
	Faults  faultSet

	Retention      time.Duration // the server's, known to the clients
	Margin         time.Duration // how long before retention a client stops sending
	Lease          time.Duration
	ReconcileDelay time.Duration
	// MaxTransit is the longest a request spends in the network. The
	// reconcile delay must exceed it (and the lease): a lookup's 404 is
	// trusted only once no attempt can still arrive.
	MaxTransit time.Duration
	// Stored5xx makes the server store its 500s and replay them.
	Stored5xx bool
	// Trace, if not nil, receives a line for each thing that happens.
	Trace func(string)

	// Dir holds the devices' FileStores in the real mode; empty keeps
	// them in memory.
	Dir string
}

// stats are a run's figures.
type stats struct {
	Actions  int
	Sessions int
	Intents  int
	Attempts int
	Charges  int
	Faults   map[string]int
	// Outcomes counts the server middleware's answers by outcome
	// (created, replayed, conflict, takeover, lost, ...).
	Outcomes map[string]int
	// Settle is how long after the world turned calm every intent was
	// settled.
	Settle time.Duration
}

func (s *stats) fault(kind string) { s.count(&s.Faults, kind) }

func (s *stats) count(m *map[string]int, k string) {
	if *m == nil {
		*m = make(map[string]int)
	}
	(*m)[k]++
}

// Add adds o's figures to s.
func (s *stats) Add(o stats) {
	s.Actions += o.Actions
	s.Sessions += o.Sessions
	s.Intents += o.Intents
	s.Attempts += o.Attempts
	s.Charges += o.Charges
	for k, v := range o.Faults {
		s.count(&s.Faults, k)
		s.Faults[k] += v - 1
	}
	for k, v := range o.Outcomes {
		s.count(&s.Outcomes, k)
		s.Outcomes[k] += v - 1
	}
	s.Settle = max(s.Settle, o.Settle)
}

// countLines lists m's counts, one "kind: n" per line, sorted by kind.
func countLines(m map[string]int) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return out
}

// world is one run.
type world struct {
	cfg   config
	clk   clock
	procs []*proc
	// parts are the network and clocks the devices reach through.
	parts parts

	netRNG, devRNG, serverRNG, appRNG, keyRNG rng

	server   *server
	devices  []*device
	faulty   bool
	sessions []*session
	intents  map[string]*intentInfo // by key
	carts    map[string]*cart       // by description
	// shown are the keys of intents made when a Pay screen was shown and
	// never tapped; untapped lists the ones a restart found stored.
	shown    map[string]bool
	untapped []string
	stats    stats
	// blocked holds the calls that sent nothing, of intents nothing had
	// sent, and yet ended with the outcome unknown.
	blocked []string
	// falseNotSent holds the calls that ended with a storage error, which
	// says that nothing was sent, after writing a request.
	falseNotSent []string
	// maxAhead is the furthest ahead a device clock has been set for days.
	maxAhead time.Duration
	// cdn is what a CDN on the lookup's path keeps, by URL
	// (lookup.caching-cdn).
	cdn map[string]*cached
}

// intentInfo is what the world knows of an intent: its cart and what the
// app was told.
type intentInfo struct {
	key      string
	cart     *cart
	reported persist.State // the resolved state the app saw first, or ""
	// promisedUnsent: a call told the app "not sent", and the user has
	// not asked for the intent again since: nothing may charge it.
	promisedUnsent bool
	// storeFailed: a write of the intent failed, or its result was
	// unknown: the store may say it is armed, and another Client may
	// have taken it over and sent it, so it may never be told "not sent"
	// again.
	storeFailed bool
}

// noteStoreFailure records a call of key whose error says a write of the
// intent failed.
func (w *world) noteStoreFailure(key string, err error) {
	if info := w.intents[key]; info != nil && errors.As(err, new(*idem.SaveError)) {
		info.storeFailed = true
	}
}

// toldNotSent records a call of key that told the app "not sent".
func (w *world) toldNotSent(key string, err error) {
	if info := w.intents[key]; info != nil && errors.Is(err, idem.ErrNotSent) {
		info.promisedUnsent = true
	}
}

// userAsks records that the user asked for the cart of key (pressed Pay):
// any intent of it may be sent again (a split double tap's other Client
// arms the first tap's intent and sends it).
func (w *world) userAsks(key string) {
	info := w.intents[key]
	if info == nil {
		return
	}
	for _, other := range w.intents {
		if other.cart == info.cart {
			other.promisedUnsent = false
		}
	}
}

// result is the outcome of a run.
type result struct {
	Stats      stats
	Violations []string
}

func (c config) withDefaults() config {
	r := newRNG(c.Seed, 99)
	if c.Actions == 0 {
		c.Actions = 300
	}
	if c.Devices == 0 {
		c.Devices = 2 + r.IntN(5)
	}
	if c.Retention == 0 {
		c.Retention = pick(r, 30*time.Minute, 2*time.Hour, 24*time.Hour)
	}
	if c.Margin == 0 {
		c.Margin = c.Retention / 6
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.MaxTransit == 0 {
		c.MaxTransit = 100 * time.Second
	}
	if c.ReconcileDelay == 0 {
		c.ReconcileDelay = 2 * time.Minute
	}
	c.Stored5xx = c.Stored5xx || (c.Faults[faultStored5xx] && r.chance(faultTable[faultStored5xx].rate))
	return c
}

// keyReader feeds the seed's randomness to the UUID generator, so that
// intents get the same keys on every replay.
type keyReader struct{ r rng }

func (k keyReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(k.r.Uint32())
	}
	return len(p), nil
}

// run runs the world of cfg and checks its invariants. It sets the UUID
// generator's source for its duration, so runs must not overlap.
func run(cfg config) result {
	cfg = cfg.withDefaults()
	w := &world{
		cfg:       cfg,
		clk:       clock{now: epoch},
		netRNG:    newRNG(cfg.Seed, 1),
		devRNG:    newRNG(cfg.Seed, 2),
		serverRNG: newRNG(cfg.Seed, 3),
		appRNG:    newRNG(cfg.Seed, 4),
		keyRNG:    newRNG(cfg.Seed, 5),
		intents:   make(map[string]*intentInfo),
		shown:     make(map[string]bool),
		carts:     make(map[string]*cart),
		cdn:       make(map[string]*cached),
		faulty:    true,
	}
	if cfg.Mode == real {
		return w.runReal()
	}
	w.parts = virtualParts{w}
	uuid.SetRand(keyReader{w.keyRNG})
	defer uuid.SetRand(nil)

	w.server = newServer(w)
	for i := range cfg.Devices {
		w.devices = append(w.devices, newDevice(w, i+1))
	}
	if cfg.Faults[faultSweep] {
		w.scheduleSweep()
	}
	w.play()
	violations := w.calm()
	w.killAll()
	w.stats.Charges = len(w.parts.charges())
	w.stats.Sessions = len(w.sessions)
	w.stats.Intents = len(w.intents)
	return result{Stats: w.stats, Violations: violations}
}

func (w *world) scheduleSweep() {
	w.clk.after(w.serverRNG.between(time.Minute, w.cfg.Retention/2), func() {
		n := w.server.handler.Sweep()
		for range n {
			w.stats.fault(faultSweep.Name() + " (records)")
		}
		w.scheduleSweep()
	})
}

// userActs makes d's user act: on a device that is up, or due to start
// again, a clock jump and one action (the app's resume after a restart).
// Both modes take their turns through it.
func (w *world) userActs(d *device) {
	if !d.up {
		if w.parts.now().Before(d.upAt) {
			return
		}
		d.start()
	}
	d.jumpClock()
	w.stats.Actions++
	d.act(func() {
		if d.restarted {
			d.restarted = false
			d.resume()
			return
		}
		pick(w.appRNG, d.apps...).step()
	})
}

// play makes the user actions of the faulty part of the run.
func (w *world) play() {
	r := w.appRNG
	var last *device
	for w.stats.Actions < w.cfg.Actions {
		gap := r.between(0, 20*time.Second)
		if r.chance(0.04) {
			gap = r.between(10*time.Minute, w.cfg.Retention/2)
		}
		w.clk.advanceTo(w.clk.now.Add(gap))
		if w.serverRNG.chance(w.cfg.Faults.rate(faultServerCrash)) {
			w.stats.fault(faultServerCrash.Name())
			w.tracef("the server process dies")
			w.killAll()
		}
		// Users act in bursts: half of the actions are on the device that
		// acted last.
		d := last
		if d == nil || r.chance(0.5) {
			d = pick(r, w.devices...)
		}
		last = d
		w.userActs(d)
	}
}

// calm stops every fault, lets the devices come back and settle their
// intents, waits for the stragglers in the network, and checks the
// invariants.
func (w *world) calm() []string {
	w.faulty = false
	// The devices that are down come back when they were due to; clocks
	// days off are corrected.
	for _, d := range w.devices {
		if d.skewed {
			d.skewed = false
			d.offset, d.maxOffset = d.preSkew[0], d.preSkew[1]
		}
		if !d.up {
			w.parts.advanceTo(maxTime(w.parts.now(), d.upAt))
			d.start()
		}
	}
	start := w.parts.now()
	// A clock that was days ahead when an attempt left makes the client
	// wait that much longer before it trusts a lookup's "not found": the
	// safe direction.
	bound := w.cfg.Retention + 4*w.cfg.ReconcileDelay + time.Hour + w.maxAhead
	var vs []string
	for round := 0; ; round++ {
		open := 0
		for _, d := range w.devices {
			d.restarted = false
			d.act(d.resume)
			recs, _ := d.mem.List(context.Background(), persist.Filter{Unresolved: true})
			for _, rec := range recs {
				if rec.State != persist.StateNotSent { // the app knows: nothing was sent
					open++
				}
			}
		}
		if open == 0 {
			break
		}
		if w.parts.now().Sub(start) > bound {
			vs = append(vs, fmt.Sprintf("%d intent(s) still unresolved %s after the world turned calm", open, w.parts.now().Sub(start)))
			break
		}
		step := w.cfg.ReconcileDelay
		switch {
		case round > 60:
			step = 6 * time.Hour
		case round > 30:
			step = time.Hour
		}
		w.parts.advanceTo(w.parts.now().Add(step))
	}
	w.stats.Settle = w.parts.now().Sub(start)
	// Requests still in the network, and workers still running, arrive.
	w.parts.advanceTo(w.parts.now().Add(w.cfg.MaxTransit + 4*w.cfg.Lease + time.Hour))
	return append(vs, w.check()...)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// tracef writes a line to the trace, if there is one.
func (w *world) tracef(format string, args ...any) {
	if w.cfg.Trace != nil {
		w.cfg.Trace(fmt.Sprintf("%-14s ", w.parts.now().Sub(w.parts.epoch()).Round(time.Millisecond)) + fmt.Sprintf(format, args...))
	}
}

// bind records that key is an intent for c.
func (w *world) bind(key string, c *cart) {
	if info, ok := w.intents[key]; ok {
		if info.cart != c {
			panic(fmt.Sprintf("sim: key %s bound to carts %s and %s", key, info.cart.desc, c.desc))
		}
		return
	}
	delete(w.shown, key) // tapped now
	w.intents[key] = &intentInfo{key: key, cart: c}
	c.sess.keys = append(c.sess.keys, key)
	w.tracef("intent %s is for cart %s", key, c.desc)
}

// bindIntent records the cart of an intent found in a device's store: an
// intent whose creation the app never saw return (it crashed right after
// the save) is still the app's.
func (w *world) bindIntent(in *idem.Intent) {
	if w.shown[in.Key()] {
		// Nobody tapped it: it must not outlive the process.
		w.untapped = append(w.untapped, in.Key())
	}
	var body struct{ Description string }
	if err := json.Unmarshal(in.Request().Body, &body); err != nil || w.carts[body.Description] == nil {
		panic(fmt.Sprintf("sim: intent %s holds no cart of the world: %s", in.Key(), in.Request().Body))
	}
	w.bind(in.Key(), w.carts[body.Description])
}

// bindBody binds key to the cart its request body names.
func (w *world) bindBody(key string, reqBody []byte) {
	var body struct{ Description string }
	if err := json.Unmarshal(reqBody, &body); err != nil || w.carts[body.Description] == nil {
		panic(fmt.Sprintf("sim: intent %s holds no cart of the world: %s", key, reqBody))
	}
	w.bind(key, w.carts[body.Description])
}

// intentView is what observe needs of an intent.
type intentView interface {
	Key() string
	State() persist.State
}

// observe records what the app now knows about in.
func (w *world) observe(a *app, in intentView) {
	info := w.intents[in.Key()]
	if info == nil {
		return
	}
	// The client's states are named as the store's.
	st := persist.State(string(in.State()))
	if !st.Resolved() {
		return
	}
	if info.reported == "" {
		info.reported = st
		w.tracef("d%d/%s is told intent %s for %s is %s", a.d.id, a.name, in.Key(), info.cart.desc, st)
	}
	if st == persist.StateSucceeded {
		info.cart.sess.paid = true
	}
}

// observeAnswer checks what a call's error tells the app: a storage error
// (*idem.SaveError) without an outcome unknown means that the call sent
// nothing, unless it comes with an answer marked as not recorded, which
// is the server's answer all the same. sent is how many requests the call
// wrote.
func (w *world) observeAnswer(a *app, key string, resp *idem.Response, err error, sent int) {
	info := w.intents[key]
	var se *idem.SaveError
	var re *idem.RetryError
	if info == nil || !errors.As(err, &se) || errors.As(err, &re) {
		return
	}
	if resp != nil && resp.NotRecorded {
		w.tracef("d%d/%s is shown the answer %d of intent %s, not recorded (%v)", a.d.id, a.name, resp.StatusCode, key, err)
		if info.reported == "" && resp.StatusCode/100 == 2 {
			info.reported = persist.StateSucceeded
			info.cart.sess.paid = true
		}
		return
	}
	if sent > 0 {
		w.falseNotSent = append(w.falseNotSent, fmt.Sprintf("intent %s for cart %s: a call that wrote %d request(s) ended with a storage error and no answer marked not recorded (%v): the app tells its user nothing was sent", key, info.cart.desc, sent, err))
	}
}

// check verifies the invariants once the world is calm.
func (w *world) check() []string {
	stored := make(map[string]persist.State)
	var vs []string
	for _, d := range w.devices {
		recs, err := d.mem.List(context.Background(), persist.Filter{})
		if err != nil {
			vs = append(vs, fmt.Sprintf("device %d: listing intents: %v", d.id, err))
		}
		for _, rec := range recs {
			stored[rec.Key] = rec.State
		}
	}
	vs = append(vs, checkLedger(w.parts.charges(), w.intents, w.sessions, stored, w.parts.epoch())...)
	for _, key := range w.untapped {
		vs = append(vs, fmt.Sprintf("intent %s was made when a Pay screen was shown, never tapped, and found unresolved after a restart", key))
	}
	return append(append(vs, w.blocked...), w.falseNotSent...)
}

// checkLedger holds the provider's charges against the intents: what
// each app was told and each device stores. Both modes check it.
func checkLedger(charges []charge, intents map[string]*intentInfo, sessions []*session, stored map[string]persist.State, epoch time.Time) []string {
	var vs []string
	bad := func(format string, args ...any) { vs = append(vs, fmt.Sprintf(format, args...)) }

	byKey := make(map[string][]charge)
	bySession := make(map[*session][]charge)
	for _, ch := range charges {
		key := strings.TrimSuffix(ch.key, rawQuotedSuffix)
		byKey[key] = append(byKey[key], ch)
		info := intents[key]
		if info == nil {
			bad("charge %s under key %s belongs to no intent the apps made", ch.stableID, ch.key)
			continue
		}
		if ch.desc != info.cart.desc {
			bad("charge %s under key %s is for cart %s, but the key's intent is for cart %s", ch.stableID, key, ch.desc, info.cart.desc)
		}
		bySession[info.cart.sess] = append(bySession[info.cart.sess], ch)
	}
	for _, s := range sessions {
		if chs := bySession[s]; len(chs) > 1 {
			var descs []string
			for _, ch := range chs {
				descs = append(descs, fmt.Sprintf("%s (key %s, %s at %s)", ch.desc, ch.key, ch.stableID, ch.at.Sub(epoch)))
			}
			bad("checkout %s was charged %d times: %s", s.id, len(chs), strings.Join(descs, "; "))
		}
	}
	// What each device stores, and what each app was told, against the
	// provider's charges.
	for _, key := range slices.Sorted(maps.Keys(intents)) {
		info := intents[key]
		for _, st := range []struct {
			how   string
			state persist.State
		}{{"reported to the app", info.reported}, {"stored on the device", stored[key]}} {
			switch st.state {
			case persist.StateSucceeded:
				ok := false
				for _, ch := range byKey[key] {
					ok = ok || ch.desc == info.cart.desc
				}
				if !ok {
					bad("intent %s for cart %s was %s as succeeded, but no charge was made for it", key, info.cart.desc, st.how)
				}
			case persist.StateFailed, persist.StateVoid, persist.StateRejected, persist.StateNotSent:
				if n := len(byKey[key]); n > 0 {
					bad("intent %s for cart %s was %s as %s, but the provider charged it (%s)", key, info.cart.desc, st.how, st.state, byKey[key][0].stableID)
				}
			}
		}
		if info.promisedUnsent && len(byKey[key]) > 0 {
			bad("intent %s for cart %s: the app was told it was not sent and never asked for it again, but the provider charged it (%s)", key, info.cart.desc, byKey[key][0].stableID)
		}
		// Failed, void and rejected all say "not charged": a declined
		// intent whose outcome could not be saved is reconciled as void.
		if info.reported != "" && stored[key].Resolved() && (stored[key] == persist.StateSucceeded) != (info.reported == persist.StateSucceeded) {
			bad("intent %s: the app was told %s, the device stores %s", key, info.reported, stored[key])
		}
	}
	return vs
}

// rawQuotedSuffix marks, in a server that compares raw key values, a key
// that arrived quoted: such a server takes "K" and K for two keys.
const rawQuotedSuffix = "~quoted"
