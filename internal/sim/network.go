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
type transport struct{ d *device }

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
	r := w.netRNG
	faulty := w.faulty
	rate := func(f faultClass) float64 {
		if !faulty {
			return 0
		}
		return w.cfg.Faults.rate(f)
	}
	isPost := req.Method == http.MethodPost
	followUp := d.redirected
	d.redirected = false
	isLookup := req.Method == http.MethodGet && req.URL.Query().Has("idempotency_key")

	// The device looks for a connection, as net/http's transport does, and
	// tells the client's trace; while it is offline (in a lift, in
	// airplane mode) the dial fails, and nothing is written.
	trace := httptrace.ContextClientTrace(req.Context())
	if trace != nil && trace.GetConn != nil {
		trace.GetConn(simHost + ":80")
	}
	if faulty && r.chance(rate(faultOffline)) {
		w.stats.fault(faultOffline.Name())
		away := r.between(time.Minute, 10*time.Minute)
		if r.chance(0.1) {
			// A flight, a holiday in airplane mode: the tap is retried a
			// day or two later.
			away = r.between(20*time.Hour, 50*time.Hour)
		}
		d.offline = maxTime(d.offline, w.clk.now.Add(away))
		w.tracef("d%d goes offline until %s", d.id, d.offline.Sub(epoch))
	}
	if faulty && w.clk.now.Before(d.offline) {
		w.tracef("d%d: offline, %s %s is not sent", d.id, req.Method, req.URL)
		return nil, dialError(r)
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

	switch {
	case r.chance(rate(faultReset)):
		w.stats.fault(faultReset.Name())
		w.tracef("d%d: connection reset before sending %s %s", d.id, req.Method, req.URL)
		return nil, errReset
	case r.chance(rate(faultProxyStatus)):
		w.stats.fault(faultProxyStatus.Name())
		a := proxyAnswer(w, pick(r, 408, 429, 500, 502, 503, 504))
		w.tracef("d%d: the intermediary answers %d to %s %s", d.id, a.status, req.Method, req.URL)
		return d.respond(req, a, false), nil
	case r.chance(rate(faultProxyOther5xx)):
		w.stats.fault(faultProxyOther5xx.Name())
		a := proxyAnswer(w, pick(r, 501, 507, 520, 521, 522, 523, 524))
		w.tracef("d%d: the intermediary answers %d to %s %s", d.id, a.status, req.Method, req.URL)
		return d.respond(req, a, false), nil
	case isPost && !followUp && r.chance(rate(faultRedirect307)):
		// To the same URL: the server fingerprints the path and the query,
		// so a redirect elsewhere would make the followed POST another
		// request to it. The follow-up is not redirected again.
		w.stats.fault(faultRedirect307.Name())
		d.redirected = true
		return d.respond(req, answer{status: http.StatusTemporaryRedirect,
			header: http.Header{"Location": {req.URL.RequestURI()}}}, false), nil
	case isPost && r.chance(rate(faultRedirectLogin)):
		w.stats.fault(faultRedirectLogin.Name())
		return d.respond(req, answer{status: http.StatusFound, header: http.Header{"Location": {"/login"}}}, false), nil
	case isPost && r.chance(rate(faultRefusePost)):
		// A gateway refuses the POST without passing it on (its session
		// expired, a WAF rule, proxy authentication), or a captive portal
		// answers it with its login page; an earlier attempt may have
		// reached the server and been charged.
		w.stats.fault(faultRefusePost.Name())
		a := pick(r,
			answer{status: http.StatusUnauthorized, header: http.Header{"Content-Type": {"application/json"}}, body: []byte(`{"message":"Unauthorized"}`)},
			answer{status: http.StatusForbidden, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Request blocked</html>")},
			answer{status: http.StatusProxyAuthRequired, header: http.Header{"Content-Type": {"text/html"}, "Proxy-Authenticate": {"Basic"}}, body: []byte("<html>Proxy login</html>")},
			answer{status: http.StatusOK, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Sign in to the Wi-Fi</html>")},
		)
		w.tracef("d%d: a gateway answers %d to %s %s", d.id, a.status, req.Method, req.URL)
		return d.respond(req, a, false), nil
	case isLookup && r.chance(rate(faultLookup404)):
		// An ingress or CDN in front of the lookup path answers its own
		// 404 page.
		w.stats.fault(faultLookup404.Name())
		a := pick(r,
			answer{status: http.StatusNotFound, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html><h1>404 Not Found</h1>nginx</html>")},
			answer{status: http.StatusNotFound, header: http.Header{"Content-Type": {"application/problem+json"}}, body: []byte(`{"type":"about:blank","title":"Not Found","status":404}`)},
		)
		return d.respond(req, a, false), nil
	case isLookup && r.chance(rate(faultLookupFallback)):
		// A CDN serving a single-page app answers every unknown path
		// with its index.html.
		w.stats.fault(faultLookupFallback.Name())
		return d.respond(req, answer{status: http.StatusOK, header: http.Header{"Content-Type": {"text/html"}},
			body: []byte(`<!doctype html><html><div id="root"></div></html>`)}, false), nil
	case isLookup && r.chance(rate(faultLookupGateway)):
		w.stats.fault(faultLookupGateway.Name())
		return d.respond(req, answer{status: pick(r, http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired),
			header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Access denied</html>")}, false), nil
	case isLookup && w.cdn[req.URL.String()] != nil && r.chance(rate(faultLookupCache)):
		// The CDN answers from its cache: the server's answer to an
		// earlier lookup of the key, nonce echo and all.
		w.stats.fault(faultLookupCache.Name())
		c := w.cdn[req.URL.String()]
		a := c.ans
		a.header = a.header.Clone()
		a.header.Set("Age", strconv.Itoa(int(w.clk.now.Sub(c.at)/time.Second)))
		w.tracef("d%d: the CDN answers %s from its cache (%d, age %s)", d.id, req.URL, a.status, w.clk.now.Sub(c.at))
		return d.respond(req, a, false), nil
	case isLookup && r.chance(rate(faultLookupReflect)):
		// A debugging gateway reflects the request into its own answer:
		// its header fields, and its query parameters as header fields.
		// So its 404 carries the key, as the server's echo would.
		w.stats.fault(faultLookupReflect.Name())
		a := answer{status: http.StatusNotFound, header: req.Header.Clone(), body: []byte("<html>No route</html>")}
		a.header.Set("Content-Type", "text/html")
		a.header.Set("Idempotency-Key", req.URL.Query().Get("idempotency_key"))
		return d.respond(req, a, false), nil
	}

	fl := &flight{d: d, gen: d.gen}
	transit := time.Duration(0)
	lost := false
	switch {
	case r.chance(rate(faultLoseRequest)):
		w.stats.fault(faultLoseRequest.Name())
		lost = true
	case isPost && faulty && w.clk.now.Before(d.stuckUntil):
		// The POST goes out on the stuck connection too.
		w.stats.fault(faultHold.Name())
		transit = r.between(time.Second, w.cfg.MaxTransit)
	case r.chance(rate(faultHold)):
		// The request is held in transit; a POST sticks the device's
		// connection for a while, so that its retries are held too (a
		// phone whose mobile data stalls), while other requests, such as
		// the reconcile lookup, may take another path.
		w.stats.fault(faultHold.Name())
		transit = r.between(time.Second, w.cfg.MaxTransit)
		if isPost {
			d.stuckUntil = w.clk.now.Add(r.between(10*time.Second, w.cfg.MaxTransit))
		}
	}
	switch {
	case r.chance(rate(faultLoseAnswer)):
		w.stats.fault(faultLoseAnswer.Name())
		fl.loseAns = true
	case r.chance(rate(faultCutBody)):
		w.stats.fault(faultCutBody.Name())
		fl.cut = true
	case r.chance(rate(faultProxyStatus)):
		// The intermediary passed the request on, and answers on its own
		// anyway: the work may be done.
		w.stats.fault(faultProxyStatus.Name() + " after forwarding")
		fl.replace = pick(r, 408, 429, 500, 502, 503, 504)
	case r.chance(rate(faultProxyOther5xx)):
		w.stats.fault(faultProxyOther5xx.Name() + " after forwarding")
		fl.replace = pick(r, 501, 507, 520, 521, 522, 523, 524)
	}
	if fl.replace != 0 {
		fl.raValue = retryAfter(w)
	}
	answerDelay := time.Duration(0)
	if r.chance(rate(faultSlowAnswer)) {
		w.stats.fault(faultSlowAnswer.Name())
		answerDelay = r.between(time.Second, 3*d.attemptTimeout/2)
	}

	url := req.URL.String()
	method := req.Method
	w.tracef("d%d sends %s %s key=%s transit=%s lost=%v loseAnswer=%v cut=%v replace=%d", d.id, method, url,
		req.Header.Get("Idempotency-Key"), transit, lost, fl.loseAns, fl.cut, fl.replace)
	if !lost {
		w.send(fl, transit, answerDelay, method, url, header, body)
		if isPost && r.chance(rate(faultDuplicate)) {
			// The intermediary sends the POST again on its own; the copy's
			// answer goes nowhere.
			w.stats.fault(faultDuplicate.Name())
			dup := &flight{d: d, gen: d.gen}
			var at time.Duration
			switch r.IntN(3) {
			case 0: // at once, racing the first copy
				at = transit
			case 1:
				at = transit + r.between(0, time.Second)
			default:
				at = r.between(transit, w.cfg.MaxTransit)
			}
			w.send(dup, at, 0, method, url, header, body)
		}
	}
	if transit > 0 && w.faulty && w.cfg.Faults[faultHoldAcrossCrash] && r.chance(0.5) {
		// The device dies while its request is in transit, and comes
		// back before the request arrives, as a killed app restarted at
		// once does.
		w.stats.fault(faultCrash.Name())
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
	if isLookup && w.cfg.Faults[faultLookupCache] && !fl.cut {
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
	var f serverFaults
	if !w.faulty || method != http.MethodPost {
		return f
	}
	r := w.serverRNG
	rate := w.cfg.Faults.rate
	switch {
	case r.chance(rate(faultCrashAfterInsert)):
		f.crashAfterInsert = true
	case r.chance(rate(faultCrashAfterCharge)):
		f.crashAfterProvider = true
	case r.chance(rate(faultError500)):
		f.errorBeforeCharge = true
	}
	if r.chance(rate(faultSlowWork)) {
		w.stats.fault(faultSlowWork.Name())
		f.slow = r.between(time.Second, 2*w.cfg.Lease)
	}
	switch {
	case r.chance(rate(faultStoreErrorInsert)):
		f.storeError = "insert"
	case r.chance(rate(faultStoreErrorComplete)):
		f.storeError = "complete"
	}
	return f
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
