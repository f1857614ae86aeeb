package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem/persist"
)

var (
	errBodyTooLarge = errors.New("idem: response body too large")
	// errStopped tells retryablehttp to stop; the reason is in the call's
	// state.
	errStopped = errors.New("idem: retry budget exhausted")
)

// retrier sends the attempts of calls through one http.Client. It is the
// only type outside this file that knows of go-retryablehttp.
type retrier struct{ rc *retryablehttp.Client }

// newRetryClient returns the go-retryablehttp client that sends through hc.
// It is made once per http.Client and shared by all calls: go-retryablehttp
// clients are safe for concurrent use, and its hooks find the state of
// their call in the request's context.
//
// go-retryablehttp's hooks see neither the request nor the context in
// places, and its defaults lose the last answer; so decisions are made in
// CheckRetry by the call's budget, waits happen there too (on the
// injectable clock, selecting on the context), Backoff returns zero, and
// ErrorHandler keeps the last answer.
func (c *Client) newRetryClient(hc *http.Client) *retrier {
	hc = redirectPolicy(hc)
	hc.Transport = budgetTransport{base: hc.Transport}
	rc := &retryablehttp.Client{
		HTTPClient:     hc,
		RetryMax:       math.MaxInt32, // the budget decides
		RequestLogHook: countAttempt,
		CheckRetry:     checkRetry,
		Backoff:        func(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 },
		ErrorHandler:   keepLastAnswer,
	}
	if c.logger != nil {
		rc.Logger = c.logger
	}
	return &retrier{rc: rc}
}

// errRedirectLoop ends a chain of redirects that does not end: no server
// that does the work answered, so the request never reached it.
var errRedirectLoop = errors.New("idem: stopped after 10 redirects")

// redirectPolicy returns a copy of hc that follows only the redirects that
// keep the request as it is, so that the answer to a redirect is never
// taken for the intent's outcome:
//
//   - 307 and 308 are followed with the same method, headers (the key
//     spelled as stored) and body, as net/http does, up to 10 in a row;
//     a longer chain ends with errRedirectLoop, and a Location whose
//     scheme is not http or https with an error: neither reached a server
//     that does the work.
//   - 301, 302 and 303 would turn a POST or PATCH into a GET, whose answer
//     (a login page, say) says nothing about the intent. They are not
//     followed, and end the call with the outcome unknown (see
//     unfollowedRedirect).
//
// hc's own CheckRedirect, if any, still decides on the redirects that are
// followed.
func redirectPolicy(hc *http.Client) *http.Client {
	cp := *hc
	check := hc.CheckRedirect
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.Method != via[0].Method {
			return http.ErrUseLastResponse
		}
		if s := req.URL.Scheme; s != "http" && s != "https" {
			return &redirectSchemeError{location: req.URL.Redacted()}
		}
		if check != nil {
			if err := check(req, via); err != nil {
				return err
			}
		} else if len(via) >= 10 { // net/http's default
			return errRedirectLoop
		}
		if st, ok := req.Context().Value(callKey{}).(*call); ok && otherURL(req.URL, via[0].URL) {
			st.redirected = true
		}
		return nil
	}
	return &cp
}

// otherURL reports a redirect to a URL whose request the server may take
// for another request under the same key: its fingerprint covers the path
// and the query. Spellings are compared as sent, so a path or query spelled
// another way counts as another URL (the safe side: the outcome is then
// asked of the lookup rather than taken as "not paid").
func otherURL(to, from *url.URL) bool {
	return to.EscapedPath() != from.EscapedPath() || to.RawQuery != from.RawQuery
}

// budgetTransport bounds each attempt of a call by what is left of the
// call's budget, so that a server that never answers, or trickles its
// answer, cannot hold Do past RetryPolicy.MaxElapsed whatever the
// http.Client's Timeout (none, for http.DefaultClient).
//
// The budget is counted on the Client's Clock, and an attempt's I/O runs in
// real time: the attempt is given the budget left at its start, as read on
// the Clock, as a real-time limit on its context, which covers the body
// too. With the system clock the two agree. With a manual clock that only
// moves when waited on, the time spent on the wire does not move it, and
// each attempt gets at most what the clock says is left.
type budgetTransport struct{ base http.RoundTripper }

func (t budgetTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, ok := req.Context().Value(callKey{}).(*call)
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	if !ok || req.Context().Err() != nil {
		// Without a call's budget, or with its context done (the base
		// transport then fails at once), there is nothing to bound.
		return base.RoundTrip(req)
	}
	limit, reason := st.b.attemptLimit()
	if limit <= 0 {
		if req.Body != nil {
			req.Body.Close()
		}
		st.cut = &stop{reason: reason}
		if !st.onWire {
			// Counted as it started, but nothing reached the wire.
			st.b.attempts--
			st.cutBeforeWire = true
		}
		return nil, fmt.Errorf("%w: nothing left for another attempt", errStopped)
	}
	st.onWire = true
	ctx, cancel := context.WithTimeout(req.Context(), limit)
	resp, err := base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		st.noteCut(ctx, req.Context(), reason)
		cancel()
		return nil, err
	}
	resp.Body = &budgetBody{ReadCloser: resp.Body, st: st, ctx: ctx, parent: req.Context(), cancel: cancel, reason: reason}
	return resp, nil
}

// CloseIdleConnections closes the base transport's idle connections, as
// http.Client.CloseIdleConnections would without the wrapper.
func (t budgetTransport) CloseIdleConnections() {
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	if c, ok := base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// budgetBody is an attempt's answer body; closing it ends the attempt's
// time limit.
type budgetBody struct {
	io.ReadCloser
	st          *call
	ctx, parent context.Context
	cancel      context.CancelFunc
	reason      StopReason
}

func (b *budgetBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.st.noteCut(b.ctx, b.parent, b.reason)
	}
	return n, err
}

func (b *budgetBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// call is the state of one call of send, reached by the hooks through the
// request's context. It is confined to that call's goroutine.
type call struct {
	c         *Client
	key       string
	b         budget
	finalBody []byte    // the body of the last answer read in full
	oversized bool      // the final answer was over the limit; no body kept
	stopped   *stop     // why the budget ended the call, once it did
	last      *Response // the last retryable answer
	lastErr   error
	// onWire: the current attempt has reached the transport.
	onWire bool
	// cut: the budget ran out during an attempt (or before it could
	// start, then cutBeforeWire).
	cut           *stop
	cutBeforeWire bool
	// canceled is the number of the attempt the call's context ended in,
	// once the attempt hook was told of it.
	canceled int
	// conns counts the connections given to a request of this call, and
	// answers the answers that began to arrive. net/http sends a request
	// that carries an Idempotency-Key again on a new connection when a
	// reused one fails before any answer, and the server may have read the
	// first copy; so while conns exceeds answers, a request may have
	// reached the server, whatever error the last try of it ended with.
	conns, answers atomic.Int32
	// wrote counts the requests of this call written to a connection
	// (httptrace's WroteHeaders), net/http's own resends included;
	// unproven is set once an attempt ended without its transport
	// reporting that it looked for a connection (GetConn): a transport
	// that fires no trace never proves that nothing was sent. It is set
	// too once any attempt got an answer.
	wrote    atomic.Int32
	traced   atomic.Bool // the current attempt fired GetConn
	unproven bool
	// unsent: no attempt of the intent can have reached the server before
	// this call (see Client.markSent).
	unsent bool
	// redirected: an attempt of the intent, in this call or an earlier
	// one, was redirected to another URL (see otherURL).
	redirected bool
	// name, url and began describe the current attempt to the attempt
	// hook; retryCost is what its retry took of the retry budget, and
	// paidFor the number of the attempt it paid for.
	name, url          string
	began              time.Time
	retryCost, paidFor int
}

// sentNothing reports a call none of whose attempts wrote its request to a
// connection, as its transport's trace proves: every attempt looked for a
// connection and none wrote its headers, nor got an answer.
func (st *call) sentNothing() bool {
	return !st.unproven && st.wrote.Load() == 0 && st.answers.Load() == 0 && st.conns.Load() == 0
}

// mayHaveSentBefore reports whether an attempt other than the one that got
// the current answer may have reached the server: an earlier call's, an
// earlier attempt of this one, or a copy net/http wrote on a reused
// connection before this one. Only then can an earlier request have done
// the work that a stranger's answer to this one hides.
func (st *call) mayHaveSentBefore() bool {
	return !st.unsent || st.b.attempts > 1 || st.wrote.Load() > 1
}

// noteCut records that the budget cut the attempt whose context is ctx, if
// it did: its time limit passed while the call's context is alive.
func (st *call) noteCut(ctx, parent context.Context, reason StopReason) {
	if st.cut == nil && ctx.Err() != nil && parent.Err() == nil {
		st.cut = &stop{reason: reason}
	}
}

// mayHaveReached reports whether a request of this call was handed to a
// connection and got no answer.
func (st *call) mayHaveReached() bool { return st.conns.Load() > st.answers.Load() }

type callKey struct{}

func callOf(ctx context.Context) *call { return ctx.Value(callKey{}).(*call) }

func countAttempt(_ retryablehttp.Logger, req *http.Request, _ int) {
	// After a cancel, retryablehttp may still start an attempt, which fails
	// at once without reaching the wire.
	if req.Context().Err() == nil {
		st := callOf(req.Context())
		st.b.attempts++
		st.began = st.c.clock.Now()
		st.onWire = false
		st.traced.Store(false)
	}
}

// checkRetry decides after each attempt. retryablehttp may call it twice for
// one attempt (again after the response handler); once the call is stopped
// it keeps saying so.
func checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	st := callOf(ctx)
	if err == nil || st.onWire && !st.traced.Load() {
		// An answer came, or the transport reports nothing (so nothing
		// it did is proven): the call may have sent its request.
		st.unproven = true
	}
	if st.stopped != nil {
		return false, errStopped
	}
	if err == nil && settles(resp.StatusCode, resp.Header) {
		// A final answer is taken even if ctx ended as it arrived: its
		// body may be read yet, and it saves a resend.
		return false, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		// The attempt is counted: the hook hears of it too, once.
		if st.b.attempts > 0 && st.canceled != st.b.attempts {
			st.canceled = st.b.attempts
			status := 0
			if err == nil {
				status = resp.StatusCode
			}
			st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: status, Err: cmp.Or(err, ctxErr)})
		}
		return false, ctxErr
	}
	if err != nil && st.cut != nil {
		// The budget ended inside the attempt: it may have reached the
		// server, so the outcome is unknown.
		st.last, st.lastErr, st.stopped = nil, err, st.cut
		if !st.cutBeforeWire {
			st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, Err: err})
		}
		return false, errStopped
	}
	status := 0
	if err == nil {
		status = resp.StatusCode
		st.last = &Response{StatusCode: resp.StatusCode, Header: resp.Header, Attempts: st.b.attempts}
		if unfollowedRedirect(resp.StatusCode) {
			// Asking again gets the same redirect.
			st.stopped = &stop{reason: StopRedirect}
			st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: status})
			return false, errStopped
		}
	} else {
		st.last = nil
		if !retryableError(err) {
			st.stopped = &stop{reason: StopFatal}
			st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, Err: err})
			return false, err
		}
	}
	st.lastErr = err
	var retryResp *http.Response
	if err == nil {
		retryResp = resp
	}
	wait, stopped := st.b.next(retryResp)
	if stopped == nil {
		if stopped = st.spendRetry(err); stopped != nil {
			wait = 0
		}
	}
	st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: status, Err: err, Retry: stopped == nil, Wait: wait})
	if stopped != nil {
		st.stopped = stopped
		return false, errStopped
	}
	if err := st.c.clock.Sleep(ctx, wait); err != nil {
		return false, err
	}
	return true, nil
}

// readFinal reads a final answer's body. A body cut off mid-way is an
// error, so the attempt counts as unanswered and is retried with the same
// key: an incomplete answer is never taken for a success. An answer larger
// than the limit, header fields included, is final all the same (asking
// again would get it again): its body is not kept.
func readFinal(resp *http.Response) error {
	st := callOf(resp.Request.Context())
	limit := st.c.maxBody - headerBytes(resp.Header)
	if limit < 0 {
		resp.Body.Close()
		st.oversized = true
		return nil
	}
	body, err := readBody(resp.Body, limit)
	if errors.Is(err, errBodyTooLarge) {
		st.oversized = true
		return st.unmarked(resp, nil)
	}
	if err != nil {
		return err
	}
	st.finalBody = body
	if err := st.unmarked(resp, body); err != nil {
		return err
	}
	return st.redirectedKeyReuse(resp, body)
}

// redirectedKeyReuse stops the call, its outcome unknown, on the server's
// "key reused" answer after an attempt of the intent was redirected to
// another URL: the server fingerprints the path and the query, so the
// redirected request, which may have done the work, is another request to
// it, and the answer says nothing of that work (StopRedirectedKeyReused).
// The call does not follow the redirect's URL itself: the lookup settles
// the intent on the server's word.
func (st *call) redirectedKeyReuse(resp *http.Response, body []byte) error {
	if st.stopped != nil || !st.redirected || !settles(resp.StatusCode, resp.Header) ||
		!st.c.keyReused(resp.StatusCode, resp.Header, body) {
		return nil
	}
	st.stopped = &stop{reason: StopRedirectedKeyReused}
	st.last = &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Attempts: st.b.attempts}
	st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: resp.StatusCode})
	return errStopped
}

// unmarked stops the call, its outcome unknown, when a final answer does
// not show that it is the server's word and could hide the work of an
// earlier request: see Client.trusted. Otherwise it returns nil, and the
// answer is final.
func (st *call) unmarked(resp *http.Response, body []byte) error {
	if st.stopped != nil || !settles(resp.StatusCode, resp.Header) {
		// Not a final answer: the budget or the context ended the call
		// on it.
		return nil
	}
	if st.c.trusted(resp.StatusCode, resp.Header, body, st.key) || !(isSuccess(resp.StatusCode) || st.mayHaveSentBefore()) {
		return nil
	}
	st.stopped = &stop{reason: StopUnmarked}
	st.last = &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Attempts: st.b.attempts, Oversized: body == nil}
	if body == nil {
		st.last.Header = st.c.storedHeader(resp.Header)
	}
	st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: resp.StatusCode})
	return errStopped
}

func keepLastAnswer(resp *http.Response, err error, _ int) (*http.Response, error) {
	if resp == nil {
		return nil, err
	}
	st := callOf(resp.Request.Context())
	if st.last != nil && resp.StatusCode == st.last.StatusCode && (st.stopped == nil || st.stopped.reason != StopUnmarked && st.stopped.reason != StopRedirectedKeyReused) {
		limit := st.c.maxBody - headerBytes(resp.Header)
		switch {
		case st.finalBody != nil:
			st.last.Body = st.finalBody // read by the response handler
		case limit < 0:
			st.last.Header, st.last.Oversized = st.c.storedHeader(resp.Header), true
		default:
			var err error
			if st.last.Body, err = readBody(resp.Body, limit); errors.Is(err, errBodyTooLarge) {
				st.last.Oversized = true
			}
		}
	}
	resp.Body.Close()
	return nil, err
}

// send makes the attempts of one call through go-retryablehttp. It returns
// a final answer, or a *RetryError when none came.
//
// unsent says that no attempt of the intent can have reached the server
// before this call.
func (c *Client) send(ctx context.Context, r *retrier, rec *persist.Record, header http.Header, left func() time.Duration, unsent bool) (*Response, *RetryError) {
	st := &call{c: c, key: rec.Key, b: newBudget(ctx, c.policyFor(ctx), c.clock, left), unsent: unsent, redirected: rec.Redirected}
	st.name, st.url = rec.Name, redactURL(rec.URL)
	fail := func(reason StopReason, err error) *RetryError {
		return &RetryError{Key: rec.Key, Reason: reason, Attempts: st.b.attempts, Elapsed: st.b.elapsed(), Err: err,
			sentNothing: st.sentNothing(), redirected: st.redirected}
	}

	traced := httptrace.WithClientTrace(context.WithValue(ctx, callKey{}, st), &httptrace.ClientTrace{
		GetConn:              func(string) { st.traced.Store(true) },
		GotConn:              func(httptrace.GotConnInfo) { st.conns.Add(1) },
		WroteHeaders:         func() { st.wrote.Add(1) },
		GotFirstResponseByte: func() { st.answers.Add(1) },
	})
	req, err := retryablehttp.NewRequestWithContext(traced, rec.Method, rec.URL, rec.Body)
	if err != nil {
		return nil, fail(StopFatal, err)
	}
	req.Header = attemptHeader(header, rec.KeyHeader)
	req.SetResponseHandler(readFinal)

	resp, err := r.rc.Do(req)
	if err == nil {
		resp.Body.Close()
		out := &Response{
			StatusCode: resp.StatusCode,
			Header:     resp.Header,
			Body:       st.finalBody,
			Replayed:   replayed(resp.Header),
			Attempts:   st.b.attempts,
			Oversized:  st.oversized,
		}
		if st.oversized {
			// Keep no more of an oversized answer than the store does.
			out.Header, out.Body = c.storedHeader(resp.Header), nil
		}
		st.attemptDone(Attempt{Key: rec.Key, Number: st.b.attempts, StatusCode: resp.StatusCode})
		st.refundRetry()
		return out, nil
	}

	switch {
	case st.stopped != nil && st.stopped.reason != StopFatal:
		e := fail(st.stopped.reason, st.lastErr)
		e.Wait = st.stopped.wait
		e.LastResponse = st.last
		return nil, e
	case ctx.Err() != nil:
		st.unspendRetry()
		reason := StopCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			reason = StopDeadline
		}
		e := fail(reason, ctx.Err())
		e.LastResponse = st.last
		return nil, e
	}
	e := fail(StopFatal, err)
	e.neverReached = neverReached(err) && !st.mayHaveReached()
	return nil, e
}

// attemptHeader returns the headers of an attempt: header's, and the key
// spelled as stored. The values' slices are shared with header, which is
// never changed (a record's, or the RoundTripper's own copy), and capped at
// their length, so that an append to one of them copies it.
func attemptHeader(header http.Header, keyHeader string) http.Header {
	h := make(http.Header, len(header)+1)
	for k, v := range header {
		h[k] = v[:len(v):len(v)]
	}
	h["Idempotency-Key"] = []string{keyHeader}
	return h
}

func (c *Client) attemptDone(a Attempt) {
	if c.onAttempt != nil {
		c.onAttempt(a)
	}
}

// readBody reads a whole body, at most limit bytes, and closes it.
func readBody(body io.ReadCloser, limit int64) ([]byte, error) {
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", errBodyTooLarge, limit)
	}
	return b, nil
}
