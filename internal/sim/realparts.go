package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	idemclock "github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/persist"
)

// The real mode runs the world's own devices and apps over the real
// parts. The fake server's handler serves on loopback TCP. Each device
// keeps a persist.FileStore on disk, closed and opened again when the
// device dies. The network's rules (netfaults.go) strike on the wire, in
// a RoundTripper before net/http. Each device runs on a goroutine of its
// own. The devices take turns at the world's lock, which a device gives
// up while its request is on the wire. The true time stands still
// meanwhile. So requests of every device reach the server at once, and a
// seed draws the same kinds of actions and faults, not the same
// schedule.

// mode chooses the parts a run uses.
type mode int

const (
	// virtual: one virtual clock, one goroutine at a time; a seed replays.
	virtual mode = iota
	// real: loopback HTTP, FileStores, a goroutine per device.
	real
)

// realEpoch is where the real mode's manual clock starts.
var realEpoch = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// realClasses are the fault classes the real mode injects. The virtual
// server's own models (server.crash, store pauses and errors, stored
// 5xx, raw keys, 303) need its worker turns; the sweep, its event queue.
var realClasses = []faultClass{
	faultLoseRequest, faultHold, faultLoseAnswer, faultCutBody, faultReset, faultSlowAnswer,
	faultProxyStatus, faultProxyOther5xx, faultRedirect307, faultRedirectLogin, faultDuplicate,
	faultRefusePost, faultCrash, faultPowerCut, faultDiskFull, faultClockForward, faultClockBack,
	faultKeySpelling, faultOffline, faultTwoClients, faultSaveAfterAnswer, faultNotSentWrite,
	faultWriteLands, faultOuterRetry, faultAuthorizer, faultHandOut, faultHoldAcrossCrash,
	faultLookup404, faultLookupFallback, faultLookupGateway, faultLookupReflect, faultLookupCache,
	faultClockDays, faultSettleAllRace,
	faultCrashAfterInsert, faultCrashAfterCharge, faultError500, faultSlowWork,
}

// realParts are the real mode's parts.
type realParts struct {
	w *world
	// mu is the world's lock. A device's goroutine holds it while its app
	// runs, and gives it up on the wire.
	mu      sync.Mutex
	clk     *idemclock.Manual
	handler *fakeserver.Handler
	srv     *httptest.Server
	// base carries every request to the server, whatever its URL's host.
	base   *http.Transport
	dir    string
	files  map[int]*persist.FileStore
	faults fault.Injector // the server's, drawn per POST
	held   []*heldCopy    // requests in transit, by due time
	// wire is read-held by each request on the wire, and held by the
	// clock as it moves. The true time stands still while a request is
	// on its way, as a request's transit is what the network's rules
	// say, not how long another device's wait lasted.
	wire sync.RWMutex
	// sideMu guards side: what the server's goroutines count.
	sideMu sync.Mutex
	side   stats
	// problems are failures of the parts themselves.
	problems []string
}

// heldCopy is a copy of a request held in transit until due.
type heldCopy struct {
	d      *device
	gen    int
	due    time.Time
	method string
	url    string
	header http.Header
	body   []byte
}

func newRealParts(w *world) *realParts {
	p := &realParts{w: w, clk: idemclock.NewManual(realEpoch), dir: w.cfg.Dir, files: make(map[int]*persist.FileStore)}
	p.handler = fakeserver.NewHandler(&fakeserver.Options{
		Clock: p.clk, Retention: w.cfg.Retention, Lease: w.cfg.Lease,
		// The server's slow work takes a thousandth of its world time in
		// real time: it must not move the clock, on which requests in
		// transit are due.
		Sleep: func(ctx context.Context, d time.Duration) error { return idemclock.System().Sleep(ctx, d/1000) },
		Logger: slog.New(outcomes{func(o string) {
			p.sideMu.Lock()
			defer p.sideMu.Unlock()
			p.side.count(&p.side.Outcomes, o)
		}}),
	})
	p.srv = httptest.NewServer(p.handler)
	addr := p.srv.Listener.Addr().String()
	p.base = &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: 16,
	}
	p.faults = serverFaultRules(w)
	return p
}

func (p *realParts) close() {
	for id, fs := range p.files {
		if err := fs.Close(); err != nil {
			p.problems = append(p.problems, fmt.Sprintf("device %d: closing its store: %v", id, err))
		}
	}
	p.base.CloseIdleConnections()
	p.srv.Close()
}

func (p *realParts) now() time.Time { return p.clk.Now() }

func (*realParts) epoch() time.Time { return realEpoch }

// advanceTo delivers the requests due by t, each at its time, then sets
// the clock to t. It holds the world's lock throughout: no device sees
// the time past a due request that has not arrived.
func (p *realParts) advanceTo(t time.Time) {
	p.wire.Lock()
	defer p.wire.Unlock()
	for len(p.held) > 0 && !p.held[0].due.After(t) {
		h := p.held[0]
		p.held = p.held[1:]
		if d := h.due.Sub(p.clk.Now()); d > 0 {
			p.clk.Advance(d)
		}
		p.deliver(h)
	}
	if d := t.Sub(p.clk.Now()); d > 0 {
		p.clk.Advance(d)
	}
}

// deliver sends a held copy to the server. Its answer goes nowhere. Copies
// of a device process that died are lost, unless held across crashes.
func (p *realParts) deliver(h *heldCopy) {
	w := p.w
	if h.d.gen != h.gen && !(w.faulty && w.cfg.Faults[faultHoldAcrossCrash]) {
		return
	}
	if h.d.gen != h.gen {
		w.stats.fault(faultHoldAcrossCrash.Name())
	}
	resp, err := p.forward(context.Background(), h.method, h.url, h.header, h.body, false)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// hold puts a copy in transit, after the copies due no later.
func (p *realParts) hold(h *heldCopy) {
	i, _ := slices.BinarySearchFunc(p.held, h.due, func(x *heldCopy, t time.Time) int {
		if x.due.After(t) {
			return 1
		}
		return -1 // after the copies due at the same time
	})
	p.held = slices.Insert(p.held, i, h)
}

// forward sends a request to the server on loopback, after drawing what
// the server does to it. It gives up the world's lock meanwhile if
// release says so.
func (p *realParts) forward(ctx context.Context, method, url string, header http.Header, body []byte, release bool) (*http.Response, error) {
	key := strings.Trim(header.Get("Idempotency-Key"), `"`)
	if method == http.MethodPost && key != "" {
		p.injectServerFaults(key, serverFaultsOf(p.faults.Inject(fault.Op{Method: method})))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = header.Clone()
	if !release {
		return p.base.RoundTrip(req)
	}
	// The clock stops before the world's lock is given up. A call of a
	// Client reads the clock, writes its store, then sends: no other
	// device may move the true time in between, by hours, a pause no
	// client can guard against. So the lock is given up on the wire
	// alone, with the clock stopped.
	// It starts again before the lock is taken back: the clock's mover
	// may hold the lock.
	p.wire.RLock()
	p.mu.Unlock()
	resp, err := p.base.RoundTrip(req)
	p.wire.RUnlock()
	p.mu.Lock()
	return resp, err
}

// injectServerFaults has the fake server apply f to key's next request.
func (p *realParts) injectServerFaults(key string, f serverFaults) {
	add := func(c faultClass, e fault.Effect) {
		rule := &fault.Rule{When: fault.Key(key), Times: 1, Draw: func(fault.Op) fault.Effect {
			p.sideMu.Lock()
			defer p.sideMu.Unlock()
			p.side.fault(c.Name())
			return e
		}}
		if err := p.handler.InjectRule(rule); err != nil {
			// Rules a request never met stay pending; at the server's
			// bound, drop them all.
			p.handler.ClearFaults()
			if err := p.handler.InjectRule(rule); err != nil {
				p.problems = append(p.problems, fmt.Sprintf("injecting %s for %s: %v", c.Name(), key, err))
			}
		}
	}
	switch {
	case f.crashAfterInsert:
		add(faultCrashAfterInsert, fault.Effect{Kind: fault.CrashAfterInsert})
	case f.crashAfterProvider:
		add(faultCrashAfterCharge, fault.Effect{Kind: fault.CrashAfterProvider})
	case f.errorBeforeCharge:
		add(faultError500, fault.Effect{Kind: fault.Error})
	}
	if f.slow > 0 {
		add(faultSlowWork, fault.Effect{Kind: fault.Delay, Delay: f.slow})
	}
}

func (p *realParts) network(d *device) http.RoundTripper {
	return transport{d: d, wire: realTransport{p: p, d: d}.send}
}

func (*realParts) clock(d *device) idemclock.Clock { return deviceClock{d} }

func (*realParts) written(d *device) int { return d.written }

func (p *realParts) radioDown(d *device, dur time.Duration) func() { return radioDown(d, p.now(), dur) }

// newStore opens device id's FileStore, or a memory store when the run
// has no directory.
func (p *realParts) newStore(id int) persist.Store {
	if p.dir == "" {
		return persist.NewMemory(nil)
	}
	fs, err := persist.OpenDir(filepath.Join(p.dir, fmt.Sprintf("d%d", id)), nil)
	if err != nil {
		panic(fmt.Sprintf("sim: opening device %d's store: %v", id, err))
	}
	p.files[id] = fs
	return fs
}

// died closes the device's FileStore and opens it again, as the next
// process will: what was on disk stays, nothing else.
func (p *realParts) died(d *device) {
	fs := p.files[d.id]
	if fs == nil {
		return
	}
	if err := fs.Close(); err != nil {
		p.problems = append(p.problems, fmt.Sprintf("device %d: closing its store: %v", d.id, err))
	}
	d.mem = p.newStore(d.id)
	d.store.Store = d.mem
}

func (p *realParts) charges() []charge { return chargesOf(p.handler) }

// realTransport sends a device's requests to the server on loopback,
// once the world's network rules passed them on the wire. It runs under
// the world's lock, and gives it up while a request is on the wire.
type realTransport struct {
	p *realParts
	d *device
}

// send sends a request the edge passed on, and waits for its answer.
func (t realTransport) send(n *netRules, op fault.Op, header http.Header, body []byte) (*http.Response, error) {
	d, w, p, req := t.d, t.d.w, t.p, n.cur.req
	way := n.transit.Inject(op)
	lost := way.Has(fault.LoseRequest)
	hold, _ := way.Get(fault.Hold)
	back := n.answer.Inject(op)
	loseAns, cut := back.Has(fault.LoseAnswer), back.Has(fault.CutAnswer)
	replace, _ := back.Get(fault.Status)
	slow, _ := n.slow.Inject(op).Get(fault.SlowAnswer)
	url := req.URL.String()
	copyOf := func(due time.Duration) *heldCopy {
		return &heldCopy{d: d, gen: d.gen, due: p.now().Add(due), method: req.Method, url: url, header: header, body: body}
	}
	if !lost {
		if dup, ok := n.duplicate.Inject(op).Get(fault.Duplicate); ok {
			p.hold(copyOf(hold.Delay + dup.Delay)) // the copy's answer goes nowhere
		}
	}
	crashes := n.crash.Inject(op).Has(crashInTransit)
	timedOut := lost || hold.Delay+slow.Delay >= d.attemptTimeout
	if !lost && (crashes || timedOut) {
		// It arrives after the device stopped waiting for it.
		p.hold(copyOf(hold.Delay))
	}
	if crashes {
		panic(crash{where: "while its request is in transit", quick: true})
	}
	if timedOut {
		d.maybeCrash("after a request was sent")
		p.advanceTo(p.now().Add(d.attemptTimeout))
		return nil, errTimeout
	}
	p.advanceTo(p.now().Add(hold.Delay))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(req.Context(), cancel)()
	resp, err := p.forward(ctx, req.Method, url, header, body, true)
	if err != nil {
		return nil, errReset
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Sent: the server has it, whatever becomes of the device now.
	d.maybeCrash("after a request was sent")
	if err != nil {
		return nil, errReset
	}
	ans := answer{status: resp.StatusCode, header: resp.Header, body: b}
	p.advanceTo(p.now().Add(slow.Delay))
	d.maybeCrash("after an answer arrived")
	if loseAns {
		return nil, errReset
	}
	if replace.Status != 0 {
		a := answer{status: replace.Status, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>edge error</html>")}
		if replace.RetryAfter != "" {
			a.header.Set("Retry-After", replace.RetryAfter)
		}
		return d.respond(req, a, false), nil
	}
	if n.cur.isLookup && w.cfg.Faults[faultLookupCache] && !cut {
		w.cdn[url] = &cached{ans: ans, at: p.now()}
	}
	return d.respond(req, ans, cut), nil
}

// runReal runs the world over the real parts and checks its invariants.
func (w *world) runReal() result {
	p := newRealParts(w)
	w.parts = p
	p.mu.Lock()
	for i := range w.cfg.Devices {
		w.devices = append(w.devices, newDevice(w, i+1))
	}
	w.playConcurrently(p)
	violations := w.calm()
	if len(violations) == 0 {
		violations = w.checkServer(p)
	}
	w.stats.Charges = len(p.charges())
	w.stats.Sessions = len(w.sessions)
	w.stats.Intents = len(w.intents)
	p.mu.Unlock()
	p.close()
	w.stats.Add(p.side)
	return result{Stats: w.stats, Violations: append(violations, p.problems...)}
}

// playConcurrently makes the user actions of the faulty part of the run,
// each device on a goroutine of its own. The caller holds the world's
// lock; the devices take turns at it.
func (w *world) playConcurrently(p *realParts) {
	var wg sync.WaitGroup
	for _, d := range w.devices {
		wg.Go(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			for w.stats.Actions < w.cfg.Actions {
				w.deviceTurn(d)
				// Another device may act now.
				p.mu.Unlock()
				runtime.Gosched()
				p.mu.Lock()
			}
		})
	}
	p.mu.Unlock()
	wg.Wait()
	p.mu.Lock()
}

// deviceTurn is one step of d's user, as the virtual world's play makes
// them: a pause, a start if the device was down, a clock jump, an action.
func (w *world) deviceTurn(d *device) {
	r := w.appRNG
	gap := r.between(0, 20*time.Second)
	if r.chance(0.04) {
		gap = r.between(10*time.Minute, w.cfg.Retention/2)
	}
	w.parts.advanceTo(w.parts.now().Add(gap))
	w.userActs(d)
}

// checkServer holds what each device stores against the server: a
// succeeded intent's lookup finds the payment the device keeps; a failed
// or void intent's lookup finds nothing. Each charge has its payment.
// (A replay of the request would be a new payment: the run ends far past
// the server's retention.)
func (w *world) checkServer(p *realParts) []string {
	var vs []string
	bad := func(format string, args ...any) { vs = append(vs, fmt.Sprintf(format, args...)) }
	ask := func(d *device, method, url string, h http.Header, body []byte) (*http.Response, []byte) {
		req, err := http.NewRequest(method, url, bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		if h != nil {
			req.Header = h.Clone()
		}
		req.Header.Set("Authorization", d.principal)
		resp, err := p.base.RoundTrip(req)
		if err != nil {
			bad("device %d: %s %s: %v", d.id, method, url, err)
			return nil, nil
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			bad("device %d: %s %s: %v", d.id, method, url, err)
			return nil, nil
		}
		return resp, b
	}
	// First, before a lookup recovers a dead worker's charge: each charge
	// has its payment on the server.
	paid := make(map[string]bool) // by cart
	for _, d := range w.devices {
		resp, b := ask(d, http.MethodGet, baseURL+"/payments", nil, nil)
		var list struct {
			Data []struct{ Description string } `json:"data"`
		}
		if resp == nil {
			continue
		}
		if err := json.Unmarshal(b, &list); err != nil || resp.StatusCode != http.StatusOK {
			bad("device %d: listing its payments: %d %v", d.id, resp.StatusCode, err)
			continue
		}
		for _, x := range list.Data {
			paid[x.Description] = true
		}
	}
	for _, ch := range p.charges() {
		// The app's own API client states its key. The RoundTripper keeps
		// such an intent in memory, for its call alone (its doc). When
		// the API client gives up on an unknown outcome, nothing settles
		// it. Its charge may then stay without a payment.
		if !paid[ch.desc] && !strings.HasPrefix(strings.Trim(ch.key, `"`), apiKeyPrefix) {
			bad("charge %s under key %s for cart %s has no payment on the server", ch.stableID, ch.key, ch.desc)
		}
	}
	for _, d := range w.devices {
		recs, err := d.mem.List(context.Background(), persist.Filter{})
		if err != nil {
			bad("device %d: listing intents: %v", d.id, err)
			continue
		}
		for _, rec := range recs {
			if rec.Tombstone || rec.Method != http.MethodPost {
				continue
			}
			look, lookBody := ask(d, http.MethodGet, lookupURL(rec.Key), nil, nil)
			if look == nil {
				continue
			}
			switch rec.State {
			case persist.StateSucceeded:
				if look.StatusCode != http.StatusOK {
					bad("intent %s is stored as succeeded, but the lookup answers %d %s", rec.Key, look.StatusCode, lookBody)
				}
				if rec.Response == nil {
					bad("intent %s is stored as succeeded without its answer", rec.Key)
				} else if a, b := paymentID(lookBody), paymentID(rec.Response.Body); a == "" || a != b {
					bad("intent %s: the lookup finds payment %q, the device keeps %q", rec.Key, a, b)
				}
			case persist.StateFailed, persist.StateVoid:
				if look.StatusCode != http.StatusNotFound {
					bad("intent %s is stored as %s, but the lookup answers %d %s", rec.Key, rec.State, look.StatusCode, lookBody)
				}
			}
		}
	}
	return vs
}

// paymentID returns the id of a payment body, or "".
func paymentID(body []byte) string {
	var p struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	return p.ID
}
