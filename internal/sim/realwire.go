package sim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/fault"
)

// answerAfterWork has the intermediary pass the request on and answer
// Effect.Status in the server's stead: the work may be done.
const answerAfterWork fault.Kind = "sim.answer-after-work"

// injectFaults draws 0 to 3 faults for an intent's key, from the
// intent's stream. A class that is off is drawn and not injected, so the
// other draws stay the same.
func (run *realRun) injectFaults(it *rIntent, r *rand.Rand) {
	for range r.IntN(4) {
		if r.IntN(3) == 0 {
			run.injectWireFault(it, r)
			continue
		}
		times := 1 + r.IntN(2)
		switch r.IntN(9) {
		case 0:
			run.serverFault(it.key, faultLoseAnswer, times, fault.Effect{Kind: fault.LoseAnswer})
		case 1:
			run.serverFault(it.key, faultSlowWork, times, fault.Effect{Kind: fault.Delay, Delay: time.Duration(1+r.IntN(5)) * time.Millisecond})
		case 2:
			run.serverFault(it.key, faultCrashAfterInsert, times, fault.Effect{Kind: fault.CrashAfterInsert})
		case 3:
			run.serverFault(it.key, faultCrashAfterCharge, times, fault.Effect{Kind: fault.CrashAfterProvider})
		case 4:
			run.serverFault(it.key, faultError500, times, fault.Effect{Kind: fault.Error})
		case 5:
			run.serverFault(it.key, faultReset, times, fault.Effect{Kind: fault.Reset})
		case 6:
			e := fault.Effect{Kind: fault.Status, Status: pick(rng{r}, http.StatusTooManyRequests, http.StatusServiceUnavailable)}
			switch r.IntN(3) {
			case 0:
				e.RetryAfter = strconv.Itoa(1 + r.IntN(3))
			case 1:
				e.RetryAfter = run.clock.Now().Add(time.Duration(1+r.IntN(3)) * time.Second).Format(http.TimeFormat)
			}
			run.serverFault(it.key, faultProxyStatus, times, e)
		case 7:
			e := fault.Effect{Kind: fault.Status, Status: pick(rng{r}, http.StatusRequestTimeout, http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout)}
			run.serverFault(it.key, faultProxyStatus, times, e)
		case 8:
			// A Retry-After above the client's cap ends the call at once:
			// the intent stays unresolved.
			run.serverFault(it.key, faultProxyStatus, times, fault.Effect{Kind: fault.Status, Status: http.StatusServiceUnavailable, RetryAfter: "3600"})
		}
	}
}

// serverFault has the fake server apply e to key's next requests.
func (run *realRun) serverFault(key string, f faultClass, times int, e fault.Effect) {
	if !run.cfg.Faults[f] {
		return
	}
	rule := &fault.Rule{When: fault.Key(key), Effect: e, Times: times}
	err := run.handler.InjectRule(rule)
	if errors.Is(err, fakeserver.ErrTooManyFaults) {
		// The faults of intents that settled before meeting them stay
		// pending; at the server's bound, drop them all.
		run.handler.ClearFaults()
		run.count("server.faults-dropped-at-bound")
		err = run.handler.InjectRule(rule)
	}
	if err != nil {
		run.bad("injecting %s for %s: %v", f.Name(), key, err)
		return
	}
	for range times {
		run.count(f.Name())
	}
}

// injectWireFault draws one fault of the network or the intermediary.
func (run *realRun) injectWireFault(it *rIntent, r *rand.Rand) {
	var f faultClass
	var e fault.Effect
	switch r.IntN(5) {
	case 0, 1:
		// Held in transit for up to nearly the reconcile delay; one time
		// in two the app is killed while the request is on its way.
		f, e = faultHold, fault.Effect{Kind: fault.Hold, Delay: time.Duration(1+r.IntN(int(realReconcileDelay/time.Second)-1)) * time.Second}
		if r.IntN(2) == 0 {
			e.Kind = crashInTransit
		}
	case 2:
		f, e = faultProxyOther5xx, fault.Effect{Kind: answerAfterWork, Status: pick(rng{r}, 501, 507, 520, 522, 524)}
	case 3:
		f, e = faultRedirect307, fault.Effect{Kind: fault.Status, Status: http.StatusTemporaryRedirect}
	case 4:
		// A login page answers with a redirect, perhaps after an earlier
		// attempt charged: the outcome is unknown and the call ends.
		f, e = faultRedirectLogin, fault.Effect{Kind: fault.Status, Status: http.StatusFound, Header: http.Header{"Location": {"/login"}}}
	}
	if !run.cfg.Faults[f] {
		return
	}
	if e.Kind == crashInTransit {
		if !run.cfg.Faults[faultHoldAcrossCrash] {
			e.Kind = fault.Hold
		} else {
			run.count(faultHoldAcrossCrash.Name())
		}
	}
	if f == faultRedirectLogin {
		it.redirected = true
	}
	run.count(f.Name())
	_ = run.wire.rules.Add(&fault.Rule{When: fault.Key(it.key), Effect: e, Times: 1})
}

// wire is what lies between the app and the fake server: it holds
// requests in transit on the true clock, across restarts, and answers for
// the intermediary. Its rules strike a key's requests one at a time, in
// the order they were drawn.
type wire struct {
	run   *realRun
	base  *http.Transport // delivers the held requests
	rules *fault.List
	// delivering is held while held requests are delivered, so that no
	// request passes one that is due and on its way.
	delivering sync.Mutex
	mu         sync.Mutex
	held       []heldRequest
	// cut holds the keys of which a round trip was cut short by a kill.
	cut map[string]bool
}

type heldRequest struct {
	req *http.Request
	due time.Time
}

func newWire(run *realRun) *wire {
	return &wire{
		run:   run,
		base:  &http.Transport{DisableKeepAlives: true},
		rules: &fault.List{Final: []fault.Kind{fault.Hold, crashInTransit, fault.Status, answerAfterWork}},
		cut:   make(map[string]bool),
	}
}

func (n *wire) close() { n.base.CloseIdleConnections() }

func (n *wire) uncertain(key string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[key]
}

// deliver lets the held requests whose time has come reach the server,
// all of them when all is set, and drops their answers.
func (n *wire) deliver(all bool) {
	n.delivering.Lock()
	defer n.delivering.Unlock()
	now := n.run.clock.Now()
	n.mu.Lock()
	var due []heldRequest
	kept := n.held[:0]
	for _, h := range n.held {
		if all || !now.Before(h.due) {
			due = append(due, h)
		} else {
			kept = append(kept, h)
		}
	}
	n.held = kept
	n.mu.Unlock()
	for _, h := range due {
		resp, err := n.base.RoundTrip(h.req)
		if err != nil {
			continue // the server's own faults apply to it too
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// genTransport is one app generation's way onto the wire.
type genTransport struct {
	w     *wire
	store *fencedStore // the generation's: killed with it
	base  http.RoundTripper
}

func (tr *genTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// What was held until now arrives first.
	tr.w.deliver(false)
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	if req.Method == http.MethodGet && req.URL.Path == "/login" {
		return wireAnswer(req, fault.Effect{Status: http.StatusOK, Body: []byte("<html>Sign in</html>")}), nil
	}
	op := fault.OpOf(req)
	var es fault.Effects
	if op.Key != "" {
		es = tr.w.rules.Inject(op)
	}
	for _, e := range es {
		switch e.Kind {
		case fault.Hold, crashInTransit:
			return tr.hold(req, e)
		case fault.Status:
			if e.Status == http.StatusTemporaryRedirect {
				// To the same URL: the followed POST is the same request.
				e.Header = http.Header{"Location": {req.URL.String()}}
			}
			return wireAnswer(req, e), nil
		case answerAfterWork:
			resp, err := tr.forward(req, op.Key)
			if err != nil {
				return nil, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			e.Body = []byte("<html>origin error</html>")
			return wireAnswer(req, e), nil
		}
	}
	return tr.forward(req, op.Key)
}

// hold keeps req in transit for e.Delay of the true clock. The app sees
// its connection break; with crashInTransit it is killed meanwhile.
func (tr *genTransport) hold(req *http.Request, e fault.Effect) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	later := req.Clone(context.Background())
	later.Body = io.NopCloser(bytes.NewReader(body))
	unlock, err := tr.store.guard()
	if err != nil {
		return nil, err // the app is dead: nothing leaves it
	}
	tr.w.mu.Lock()
	tr.w.held = append(tr.w.held, heldRequest{req: later, due: tr.w.run.clock.Now().Add(e.Delay)})
	tr.w.mu.Unlock()
	unlock()
	if e.Kind == crashInTransit {
		if err := tr.w.run.restart(nil); err != nil {
			tr.w.run.bad("restart: %v", err)
		}
	}
	return nil, errors.New("sim: the connection broke while the request was in transit")
}

// forward sends req to the server. When the app is killed meanwhile, the
// request may still sit in a socket for a moment of real time, which the
// manual clock does not see; its key is then marked cut.
func (tr *genTransport) forward(req *http.Request, key string) (*http.Response, error) {
	resp, err := tr.base.RoundTrip(req)
	if req.Context().Err() != nil && key != "" {
		tr.w.mu.Lock()
		tr.w.cut[key] = true
		tr.w.mu.Unlock()
	}
	return resp, err
}

// wireAnswer is the intermediary's answer e to req.
func wireAnswer(req *http.Request, e fault.Effect) *http.Response {
	h := e.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", "text/html")
	if e.RetryAfter != "" {
		h.Set("Retry-After", e.RetryAfter)
	}
	return &http.Response{
		StatusCode: e.Status, Status: strconv.Itoa(e.Status) + " " + http.StatusText(e.Status),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(string(e.Body))), ContentLength: int64(len(e.Body)), Request: req,
	}
}
