package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/fakeserver/fault"
)

// The network between a device and the server, with the boxes in between:
// it loses requests and answers, holds requests in transit, cuts bodies,
// resets connections, and puts an intermediary in front of the server that
// answers on its own (408, 429, 5xx, with or without Retry-After),
// redirects, or sends a POST twice.

// simHost is the server's address in the world.
const simHost = "api.sim.invalid"

// baseURL is the server's URL.
const baseURL = "http://" + simHost

var (
	errReset   = errors.New("sim: connection reset by peer")
	errTimeout = errors.New("sim: timeout awaiting response headers")
)

// transport is a device's http.RoundTripper: the network as the device
// sees it.
type transport struct {
	d *device
	// wire sends a request the edge passed on and waits for its answer.
	// Nil is the modelled network (netRules.send); the real mode sends it
	// on loopback.
	wire func(n *netRules, op fault.Op, header http.Header, body []byte) (*http.Response, error)
}

// flight is one copy of a request on its way to the server, and its
// answer on its way back.
type flight struct {
	d        *device
	gen      int // the device generation that sent it
	ready    bool
	timedOut bool
	ans      answer
	cut      bool // the answer's body is cut short
	loseAns  bool
	replace  int    // the intermediary replaces the answer with this status
	raValue  string // its Retry-After, if any
}

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	d := t.d
	w := d.w
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
	}
	if k := strings.Trim(req.Header.Get("Idempotency-Key"), `"`); req.Method == http.MethodPost && k != "" && w.intents[k] == nil {
		// An intent the RoundTripper made: the app is not told its key.
		w.bindBody(k, body)
	}
	d.maybeCrash("before a request is sent")
	w.stats.Attempts++
	header := req.Header.Clone()
	header.Set("Authorization", d.principal)
	op := fault.OpOf(req)
	c := &call{req: req, faulty: w.faulty, followUp: d.redirected, isPost: isPost(op), isLookup: isLookup(op)}
	d.redirected = false
	if d.net == nil {
		d.net = newNetRules(d)
	}
	n := d.net
	n.cur = c

	// The device looks for a connection, as net/http's transport does, and
	// tells the client's trace. While it is offline (in a lift, in
	// airplane mode) the dial fails, and nothing is written.
	trace := httptrace.ContextClientTrace(req.Context())
	if trace != nil && trace.GetConn != nil {
		trace.GetConn(req.URL.Host)
	}
	if e, ok := n.offline.Inject(op).Get(goOffline); ok {
		d.offline = maxTime(d.offline, w.parts.now().Add(e.Delay))
		w.tracef("d%d goes offline until %s", d.id, d.offline.Sub(epoch))
	}
	if c.faulty && w.parts.now().Before(d.offline) {
		w.tracef("d%d: offline, %s %s is not sent", d.id, req.Method, req.URL)
		return nil, dialError(w.netRNG)
	}
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{})
	}
	d.written++
	if trace != nil && trace.WroteHeaders != nil {
		trace.WroteHeaders()
	}

	// The login page of the intermediary, reached by following its 302.
	if req.URL.Path == "/login" {
		return d.respond(req, answer{status: http.StatusOK, header: http.Header{"Content-Type": {"text/html"}},
			body: []byte("<html><body>Please sign in</body></html>")}, false), nil
	}
	edge := n.edge.Inject(op)
	if edge.Has(fault.Reset) {
		return nil, errReset
	}
	if e, ok := edge.Get(fault.Status); ok {
		return d.respond(req, answer{status: e.Status, header: e.Header, body: e.Body}, false), nil
	}
	if t.wire != nil {
		return t.wire(n, op, header, body)
	}
	return n.send(op, header, body)
}

// send sends a request the edge passed on, and waits for its answer.
// It asks the rules before it waits: a call made meanwhile changes n.cur.
func (n *netRules) send(op fault.Op, header http.Header, body []byte) (*http.Response, error) {
	c := n.cur
	d, w, req := n.d, n.d.w, c.req
	fl := &flight{d: d, gen: d.gen}
	way := n.transit.Inject(op)
	lost := way.Has(fault.LoseRequest)
	hold, _ := way.Get(fault.Hold)
	transit := hold.Delay
	c.transit = transit
	back := n.answer.Inject(op)
	fl.loseAns = back.Has(fault.LoseAnswer)
	fl.cut = back.Has(fault.CutAnswer)
	if e, ok := back.Get(fault.Status); ok {
		fl.replace, fl.raValue = e.Status, e.RetryAfter
	}
	slow, _ := n.slow.Inject(op).Get(fault.SlowAnswer)

	url := req.URL.String()
	method := req.Method
	w.tracef("d%d sends %s %s key=%s transit=%s lost=%v loseAnswer=%v cut=%v replace=%d", d.id, method, url,
		req.Header.Get("Idempotency-Key"), transit, lost, fl.loseAns, fl.cut, fl.replace)
	if !lost {
		w.send(fl, transit, slow.Delay, method, url, header, body)
		if dup, ok := n.duplicate.Inject(op).Get(fault.Duplicate); ok {
			// The copy's answer goes nowhere.
			w.send(&flight{d: d, gen: d.gen}, transit+dup.Delay, 0, method, url, header, body)
		}
	}
	if n.crash.Inject(op).Has(crashInTransit) {
		panic(crash{where: "while its request is in transit", quick: true})
	}
	d.maybeCrash("after a request was sent")

	timeout := w.clk.now.Add(d.attemptTimeout)
	w.clk.at(timeout, func() { fl.timedOut = true })
	for !fl.ready && !fl.timedOut {
		if !w.clk.step() {
			panic("sim: a device waits for an answer and nothing is scheduled")
		}
	}
	if !fl.ready {
		w.tracef("d%d times out", d.id)
		return nil, errTimeout
	}
	d.maybeCrash("after an answer arrived")
	if fl.ans.aborted || fl.loseAns {
		return nil, errReset
	}
	if fl.replace != 0 {
		a := answer{status: fl.replace, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>edge error</html>")}
		if fl.raValue != "" {
			a.header.Set("Retry-After", fl.raValue)
		}
		return d.respond(req, a, false), nil
	}
	if c.isLookup && w.cfg.Faults[faultLookupCache] && !fl.cut {
		// A CDN whose rule caches everything keeps the answer.
		w.cdn[req.URL.String()] = &cached{ans: fl.ans, at: w.clk.now}
	}
	return d.respond(req, fl.ans, fl.cut), nil
}

// cached is an answer a CDN on the lookup's path keeps, and when it got it.
type cached struct {
	ans answer
	at  time.Time
}

// send delivers a copy of a request to the server after transit, and its
// answer back after answerDelay. Copies of a device generation that died
// are lost unless faultHoldAcrossCrash is on.
func (w *world) send(fl *flight, transit, answerDelay time.Duration, method, url string, header http.Header, body []byte) {
	f := w.drawServerFaults(method)
	w.clk.after(transit, func() {
		if fl.d.gen != fl.gen && !(w.faulty && w.cfg.Faults[faultHoldAcrossCrash]) {
			return
		}
		if fl.d.gen != fl.gen {
			w.stats.fault(faultHoldAcrossCrash.Name())
		}
		w.tracef("server receives %s %s key=%s from d%d faults=%+v", method, url, header.Get("Idempotency-Key"), fl.d.id, f)
		w.spawn(func(p *proc) {
			a := w.server.serve(p, method, url, header, body, f)
			w.tracef("server answers %d (aborted=%v) to %s %s key=%s", a.status, a.aborted, method, url, header.Get("Idempotency-Key"))
			w.clk.after(answerDelay, func() {
				fl.ans, fl.ready = a, true
			})
		})
	})
}

// drawServerFaults draws what the server does to one request.
func (w *world) drawServerFaults(method string) serverFaults {
	return serverFaultsOf(w.server.faults.Inject(fault.Op{Method: method}))
}

// proxyAnswer is an intermediary's own answer.
func proxyAnswer(w *world, status int) answer {
	a := answer{status: status, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>edge: " + strconv.Itoa(status) + "</html>")}
	if ra := retryAfter(w); ra != "" {
		a.header.Set("Retry-After", ra)
	}
	return a
}

// retryAfter draws a Retry-After value: none, delta-seconds (some above the
// client's cap), or an HTTP-date on the world's true clock.
func retryAfter(w *world) string {
	r := w.netRNG
	switch r.IntN(4) {
	case 0:
		return ""
	case 1:
		return strconv.Itoa(pick(r, 1, 2, 5, 30))
	case 2:
		return strconv.Itoa(pick(r, 61, 120, 3600))
	default:
		return w.clk.now.Add(r.between(0, 40*time.Second)).UTC().Format(http.TimeFormat)
	}
}

// respond makes the *http.Response a device reads.
func (d *device) respond(req *http.Request, a answer, cut bool) *http.Response {
	h := a.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	var body io.ReadCloser = io.NopCloser(bytes.NewReader(a.body))
	if cut && len(a.body) > 0 {
		body = io.NopCloser(io.MultiReader(bytes.NewReader(a.body[:len(a.body)/2]), errReader{io.ErrUnexpectedEOF}))
	}
	if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.GotFirstResponseByte != nil {
		trace.GotFirstResponseByte()
	}
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", a.status, http.StatusText(a.status)),
		StatusCode:    a.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          body,
		ContentLength: int64(len(a.body)),
		Request:       req,
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// lookupURL is the reconcile lookup for key.
func lookupURL(key string) string {
	return baseURL + "/payments?idempotency_key=" + strings.ReplaceAll(key, "\"", "")
}

// dialError is how a dial fails on a device without a network: refused,
// unreachable, no such host, timed out.
func dialError(r rng) error {
	switch r.IntN(4) {
	case 0:
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	case 1:
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: network is unreachable")}
	case 2:
		return &net.DNSError{Err: "no such host", Name: simHost, IsNotFound: true}
	}
	return &net.OpError{Op: "dial", Net: "tcp", Err: errTimeout}
}
