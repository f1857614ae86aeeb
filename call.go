package idem

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem/persist"
)

// One call is the attempts that one Do makes of one intent. Send, Settle
// and a request through the RoundTripper make calls too. A call runs from
// the first attempt to the final answer, or to the reason it stops.
//
// go-retryablehttp drives the attempt loop, and idem decides every step of
// it. The loop makes each attempt on a body it rewinds. It runs the
// response handler on a final answer inside the loop. After each attempt
// it asks CheckRetry whether to go on. Every hook it calls is a method of
// call, in this file. Each decides from the call's state alone:
//
//   - RequestLogHook: call.attemptBegins counts the attempt. It asks the
//     Authorizer for the attempt's credentials.
//   - CheckRetry: call.afterAttempt says whether another attempt follows.
//     It computes the wait (budget, retry.go, with cenkalti/backoff). It
//     sleeps on the Client's clock (Config.Clock) within the call's
//     context. go-retryablehttp's own wait runs on time.NewTimer, so its
//     Backoff returns zero.
//   - The response handler: call.readFinal reads the final answer's body.
//   - ErrorHandler: call.keepLast keeps the last answer, which
//     go-retryablehttp would drop.
//
// The budget ends a call, not a count, so RetryMax is unbounded. The Logger
// stays nil. go-retryablehttp's lines speak of its loop, not of the intent.
// It logs "request failed" at ERROR for an answer idem retries. It counts
// the retries left of RetryMax, which means nothing here. idem logs from its
// own hooks, with the caller's context. It logs one line per attempt
// (DEBUG), and one per wait and per outcome (INFO).
//
// The call's state is the struct call, and only the methods in this file
// write it. One retryablehttp.Client serves every call. So its hooks find
// the call through the request's context (callIn). The transport
// (budgetTransport) and the redirect policy find it so too. They read and
// write it through its methods.

// retrier sends the attempts of calls through one http.Client.
type retrier struct{ rc *retryablehttp.Client }

// errStopped tells retryablehttp to stop. The reason is in the call's
// state.
var errStopped = errors.New("idem: retry budget exhausted")

// newCall returns the state of a call that sends rec under ctx's retry policy.
// cfg and tokens are the Client's. left reads how long rec's intent may
// still be sent (Client.leftOf). header is the stored one, or the live
// request's.
func newCall(ctx context.Context, cfg *config, tokens *tokenBucket, left intentLeft, rec *persist.Record, header http.Header) *call {
	st := &call{cfg: cfg, key: rec.Key, redirected: rec.Redirected, tokens: tokens}
	// The budget reads the intent's age through the call, which holds it. So
	// it needs no allocation of its own.
	st.left = left
	st.b = newBudget(ctx, cfg.policyFor(ctx), cfg.clock, &st.left)
	st.name, st.url, st.target = rec.Name, rec.URL, rec.URL
	// The key's value lives in the call, so it needs no allocation of its own.
	st.keyValue[0] = rec.KeyHeader
	st.nonce[0] = rec.Rev
	st.method, st.body, st.header = rec.Method, rec.Body, header
	return st
}

// run makes the call's attempts through r. It returns a final answer, or
// a *RetryError when none came.
func (st *call) run(ctx context.Context, r *retrier) (*Response, *RetryError) {
	req, err := retryablehttp.NewRequestWithContext(st.withTrace(ctx), st.method, st.target, retryablehttp.ReaderFunc(st.bodyReader))
	if err == nil {
		st.attemptHeader(req.Header)
		req.SetResponseHandler(func(resp *http.Response) error { return callOf(resp.Request.Context()).readFinal(resp) })
		var resp *http.Response
		if resp, err = r.rc.Do(req); err == nil {
			return st.answered(resp), nil
		}
	}
	return nil, st.failed(ctx, err)
}

// attemptHeader puts the headers of every attempt in h, the request's own
// empty map. They are the call's header, and the key spelled as stored. The
// values' slices are shared with the call's header, which never changes. That
// is a record's, or the RoundTripper's own copy. The slices are capped at
// their length, so an append to one of them copies it.
func (st *call) attemptHeader(h http.Header) {
	for k, v := range st.header {
		h[k] = v[:len(v):len(v)]
	}
	h["Idempotency-Key"] = st.keyValue[:]
}

// bodyReader gives go-retryablehttp a reader of the request's body. It is
// rewound for every attempt from a fresh reader over the same bytes.
// go-retryablehttp asks for one reader to learn the length, and closes it
// unread. Then it asks for one per attempt. The first two are the reader the
// call holds, read by one at a time. That saves their allocations. Each retry
// gets its own, since net/http may still be closing the last attempt's. It is
// a *bytes.Reader, which go-retryablehttp wraps in an io.NopCloser. net/http
// knows that body to be in memory. So it writes the request's head and body
// together. The reader is the current attempt's (sendGate).
func (st *call) bodyReader() (io.Reader, error) {
	st.bodies++
	r := &st.firstBody
	if st.bodies > 2 {
		r = new(bytes.Reader)
	}
	r.Reset(st.body)
	st.current = r
	return r, nil
}

// sendGate runs as the current attempt gets its connection. It checks the
// stored send deadline on a fresh reading of the clocks. That is the last
// moment before the request leaves. A device may sleep while the
// connection is dialing. Go's timers, and so the attempt's context, stop
// while it sleeps. The clock that counts sleep does not. Another Client may
// have trusted a lookup's miss since. Past the deadline, the attempt's body
// is emptied. Over HTTP/1 net/http then refuses to write it: its length
// is not the one it declared, and the head waits for the body. Nothing
// leaves. Over HTTP/2 the head leaves, declaring the whole length, and
// then an empty end of stream. A server may answer that head. The answer
// is discarded (gated). A request is never written whole. A request with
// no body is not gated.
func (st *call) sendGate() {
	if st.current == nil {
		return // no body: nothing to cut
	}
	if window, send := st.left.lefts(); window <= 0 || send <= 0 {
		st.current.Reset(nil)
		st.gated.Store(true)
	}
}

// cutAtGate reports whether the gate cut an attempt's body (sendGate).
func (st *call) cutAtGate() bool { return st.gated.Load() }

// errPastSendDeadline ends an attempt that the gate cut (sendGate). Over
// HTTP/2 the server may answer the head it got. That answer is discarded.
var errPastSendDeadline = errors.New("idem: the send deadline passed as the attempt's connection arrived; its request was not written whole")

// call is the state of one call. The retrier's hooks reach it through the
// request's context. It is confined to that call's goroutine. The exception is
// the counters that the client trace moves (atomic).
type call struct {
	cfg *config
	key string
	// method, target, body and header are the request each attempt sends, with
	// the key (attemptHeader).
	method, target string
	body           []byte
	header         http.Header
	keyValue       [1]string // the Idempotency-Key's value in header
	// nonce is the call's attempt nonce (attemptNonceHeader). It is the
	// version of the record the call sends, or one drawn at its first attempt.
	// Every attempt of the call carries it.
	nonce [1]string
	// answer is the first attempt's answer body (budgetTransport). It is held
	// here to save an allocation. answerUsed is set once it is taken.
	answer     budgetBody
	answerUsed bool
	b          budget
	left       intentLeft // what b reads the intent's age through
	finalBody  []byte     // the body of the last answer read in full
	oversized  bool       // the final answer was over the limit, and no body is kept
	// own is set when the final answer is the server's word (Client.trusted),
	// not a stranger's on the path. Only the server's word refunds the retry
	// budget.
	own     bool
	stopped *stop     // why the budget ended the call, once it did
	last    *Response // the last retryable answer
	lastErr error
	// wired: the current attempt has reached the transport.
	wired bool
	// cut is set when the budget ran out during an attempt. cutBeforeWire is
	// set when it ran out before the attempt could start.
	cut           *stop
	cutBeforeWire bool
	// canceled is the number of the attempt the call's context ended in, once
	// the attempt hook was told of it.
	canceled int
	// conns counts the connections given to a request of this call. answers
	// counts the answers that began to arrive. A reused connection may fail
	// before any answer. Then net/http sends a request with an Idempotency-Key
	// again on a new connection. The server may have read the first copy. So
	// while conns exceeds answers, a request may have reached the server. That
	// holds whatever error the last try of it ended with.
	conns, answers atomic.Int32
	// wrote counts the requests of this call written to a connection
	// (httptrace's WroteHeaders). net/http's own resends count too. unproven
	// is set once an attempt ended without its transport reporting GetConn,
	// that it looked for a connection. A transport that fires no trace never
	// proves that nothing was sent. unproven is set too once any attempt got
	// an answer.
	wrote    atomic.Int32
	traced   atomic.Bool // the current attempt fired GetConn
	unproven bool
	// redirected is set when an attempt of the intent was redirected to
	// another URL (see otherURL). That attempt may be of this call or an
	// earlier one.
	redirected bool
	// name, url and began describe the current attempt to the attempt hook.
	// url is the request's URL as sent. attemptDone redacts it once, when
	// there is a hook or logger to tell. retryCost is what the attempt's retry
	// took of the retry budget. paidFor is the number of the attempt it paid
	// for.
	name, url          string
	urlRedacted        bool
	trace              httptrace.ClientTrace // the call's, held here to save an allocation
	ctx                callContext           // the caller's context carrying the call, likewise
	firstBody          bytes.Reader          // the request's body as the first attempt reads it, likewise
	current            *bytes.Reader         // the reader of the current attempt's body (bodyReader)
	gated              atomic.Bool           // the gate cut an attempt's body (sendGate)
	bodies             int                   // how many readers of the body the retrier asked for
	began              time.Time
	retryCost, paidFor int
	tokens             *tokenBucket // the Client's retry budget
	// authErr is Config.Authorizer's failure before the current attempt. The
	// attempt is not sent (budgetTransport), and the call ends.
	authErr error
}

// authorize puts the credentials Config.Authorizer gives on the attempt req is
// about to send. Or it keeps the Authorizer's failure for budgetTransport,
// which then sends nothing. The credentials live in the attempt's header only.
// The intent's stored header never holds them.
func (st *call) authorize(req *http.Request) {
	if st.cfg.authorize == nil || req.Context().Err() != nil {
		return
	}
	v, err := st.cfg.authorize(req.Context(), st.key)
	switch {
	case err != nil:
		st.authErr = &authorizerError{err: err}
	case !validFieldValue(v):
		// net/http would refuse it before it dials, on every attempt.
		st.authErr = &authorizerError{err: errBadFieldValue}
	case v == "":
		req.Header.Del("Authorization")
	default:
		req.Header.Set("Authorization", v)
	}
}

// authorizerError is Config.Authorizer's failure, as the call reports it.
type authorizerError struct{ err error }

func (e *authorizerError) Error() string { return "idem: the Authorizer failed: " + e.err.Error() }
func (e *authorizerError) Unwrap() error { return e.err }

// sentNothing reports a call none of whose attempts wrote its request to a
// connection. The transport's trace must prove it. Every attempt looked for a
// connection. None wrote its headers, and none got an answer.
func (st *call) sentNothing() bool {
	return !st.unproven && st.wrote.Load() == 0 && st.answers.Load() == 0 && st.conns.Load() == 0
}

// noteCut records that the budget cut the attempt whose context is ctx, if it
// did. Then its time limit passed while the call's context is alive.
func (st *call) noteCut(ctx, parent context.Context, reason string) {
	if st.cut == nil && ctx.Err() != nil && parent.Err() == nil {
		st.cut = &stop{reason: reason}
	}
}

// onWire puts the current attempt on the wire. It returns how long the attempt
// may take, and the part of the budget that ends it first
// (budget.attemptLimit). Or it returns the error that ends the attempt unsent,
// when nothing is left of the budget.
func (st *call) onWire() (time.Duration, string, error) {
	limit, reason := st.b.attemptLimit()
	if limit <= 0 {
		st.cut = &stop{reason: reason}
		if !st.wired {
			// Counted as it started, but nothing reached the wire.
			st.b.attempts--
			st.cutBeforeWire = true
		}
		return 0, reason, fmt.Errorf("%w: nothing left for another attempt", errStopped)
	}
	st.wired = true
	return limit, reason, nil
}

// answerBody returns body, the answer to the current attempt. Closing it ends
// the attempt's time limit (cancel). It tells the call of a read cut short by
// that limit (ctx, a child of parent). The first attempt's is the call's own.
func (st *call) answerBody(body io.ReadCloser, ctx, parent context.Context, cancel context.CancelFunc, reason string) io.ReadCloser {
	b := &st.answer
	if st.answerUsed {
		b = new(budgetBody)
	}
	st.answerUsed = true
	*b = budgetBody{ReadCloser: body, st: st, ctx: ctx, parent: parent, cancel: cancel, reason: reason}
	return b
}

// budgetBody is an attempt's answer body. Closing it ends the attempt's time
// limit.
type budgetBody struct {
	io.ReadCloser
	st          *call
	ctx, parent context.Context
	cancel      context.CancelFunc
	reason      string
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

// redirectedAway records that an attempt was redirected to another URL
// (see otherURL).
func (st *call) redirectedAway() { st.redirected = true }

// mayHaveReached reports whether a request of this call was handed to a
// connection and got no answer.
func (st *call) mayHaveReached() bool { return st.conns.Load() > st.answers.Load() }

type callKey struct{}

// callOf returns the call that ctx, a request's context, carries.
func callOf(ctx context.Context) *call { return ctx.Value(callKey{}).(*call) }

// callIn returns the call that ctx carries, if any. A request of the Client's
// http.Client may be no call's, such as a lookup's.
func callIn(ctx context.Context) (*call, bool) {
	st, ok := ctx.Value(callKey{}).(*call)
	return st, ok
}

// callContext is a call's context. It is the caller's, and its Value answers
// callKey with the call. It lives in the call. So carrying the call costs no
// allocation of its own, as context.WithValue's would.
type callContext struct {
	context.Context
	st *call
}

func (c *callContext) Value(key any) any {
	if key == (callKey{}) {
		return c.st
	}
	return c.Context.Value(key)
}

// withTrace returns ctx carrying the call, for the retrier's hooks. It also
// returns the client trace by which the call tells what its attempts wrote.
func (st *call) withTrace(ctx context.Context) context.Context {
	st.trace = httptrace.ClientTrace{
		GetConn:              func(string) { st.traced.Store(true) },
		GotConn:              func(httptrace.GotConnInfo) { st.conns.Add(1); st.sendGate() },
		WroteHeaders:         func() { st.wrote.Add(1) },
		GotFirstResponseByte: func() { st.answers.Add(1) },
	}
	st.ctx = callContext{Context: ctx, st: st}
	return httptrace.WithClientTrace(&st.ctx, &st.trace)
}

// attemptBegins counts the attempt req begins and gives it its
// credentials.
func (st *call) attemptBegins(req *http.Request) {
	st.attemptStarted(req.Context())
	// A nonce no server echoes, so an answer that carries it is a reflection
	// (see reflected). There is one per call, since a gateway reflects each
	// attempt as it reflects the first. Its value is the version of the
	// record the call sends, unique already (revs). An ephemeral intent's
	// first call has none, and draws one.
	if st.nonce[0] == "" {
		st.nonce[0] = rand.Text()
	}
	req.Header[attemptNonceHeader] = st.nonce[:]
	st.authorize(req)
}

// attemptStarted counts an attempt as the retrier starts it. After a cancel,
// the retrier may still start an attempt. That attempt fails at once without
// reaching the wire, and it is not counted.
func (st *call) attemptStarted(ctx context.Context) {
	if ctx.Err() == nil {
		st.b.attempts++
		st.began = st.cfg.clock.Now()
		st.wired = false
		st.traced.Store(false)
	}
}

// answered returns the final answer the call got, as the Response of Do.
func (st *call) answered(resp *http.Response) *Response {
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
		out.Header, out.Body = st.cfg.storedHeader(resp.Header), nil
	}
	st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: resp.StatusCode})
	st.refundRetry()
	return out
}

// failed returns why the call ended without a final answer. err is the
// retrier's, and ctx the call's.
func (st *call) failed(ctx context.Context, err error) *RetryError {
	switch {
	case st.stopped != nil && st.stopped.reason != stopFatal:
		e := st.retryError(st.stopped.reason, st.lastErr)
		e.Wait = st.stopped.wait
		e.LastResponse = st.last
		return e
	case ctx.Err() != nil:
		st.unspendRetry()
		reason := stopCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			reason = stopDeadline
		}
		e := st.retryError(reason, ctx.Err())
		e.LastResponse = st.last
		return e
	}
	e := st.retryError(stopFatal, err)
	e.unreached = neverReached(err) && !st.mayHaveReached()
	return e
}

func (st *call) retryError(reason string, err error) *RetryError {
	// The app logs the error. The URL in net/http's error carries no
	// credential, as the attempt hook's does not.
	return &RetryError{Key: st.key, Reason: reason, Attempts: st.b.attempts, Elapsed: st.b.elapsed(), Err: redactErr(err),
		noneWritten: st.sentNothing(), afterRedirect: st.redirected, stopped: errors.Is(err, errStopped)}
}

// afterAttempt is the retry loop's decision after each attempt. It says
// whether to send another, after waiting for it on the Client's clock. Or it
// says why the call ends. The retrier may ask twice for one attempt, again
// after readFinal. Once the call is stopped, it keeps saying so.
func (st *call) afterAttempt(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if err == nil || st.wired && !st.traced.Load() {
		// An answer came, or the transport reports nothing and so proves
		// nothing. Either way the call may have sent its request.
		st.unproven = true
	}
	if st.stopped != nil {
		return false, errStopped
	}
	if st.authErr != nil {
		// No retry can fix it, and the attempt sent nothing.
		st.last, st.lastErr, st.stopped = nil, st.authErr, &stop{reason: stopAuthorizer}
		st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, Err: st.authErr})
		return false, errStopped
	}
	if err == nil && isFinal(resp.StatusCode, resp.Header, st.key) {
		// A final answer is taken even if ctx ended as it arrived. Its body
		// may be read yet, and it saves a resend.
		return false, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return false, st.canceledBy(ctxErr, resp, err)
	}
	if err != nil && st.cut != nil {
		return false, st.cutShort(err)
	}
	status := 0
	if err == nil {
		status = resp.StatusCode
		st.last = &Response{StatusCode: resp.StatusCode, Header: resp.Header, Attempts: st.b.attempts}
		if unfollowedRedirect(resp.StatusCode) {
			// Asking again gets the same redirect.
			st.stopped = &stop{reason: stopRedirect}
			st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: status})
			return false, errStopped
		}
	} else {
		st.last = nil
		if !retryableError(err) {
			st.stopped = &stop{reason: stopFatal}
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
	st.logWait(wait, status, err)
	if err := st.cfg.clock.Sleep(ctx, wait); err != nil {
		return false, err
	}
	return true, nil
}

// canceledBy ends the call when its context ended (ctxErr) after an attempt
// that got resp or err. The attempt is counted, and the hook hears of it too,
// once.
func (st *call) canceledBy(ctxErr error, resp *http.Response, err error) error {
	if st.b.attempts > 0 && st.canceled != st.b.attempts {
		st.canceled = st.b.attempts
		status := 0
		if err == nil {
			status = resp.StatusCode
		}
		st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: status, Err: cmp.Or(err, ctxErr)})
	}
	return ctxErr
}

// cutShort ends the call whose budget ended inside the attempt that got err.
// The attempt may have reached the server, so the outcome is unknown.
func (st *call) cutShort(err error) error {
	st.last, st.lastErr, st.stopped = nil, &budgetSpent{reason: st.cut.reason, err: redactErr(err)}, st.cut
	if !st.cutBeforeWire {
		// The hook hears of the budget's error, as the *RetryError carries it.
		// It does not hear of the context.DeadlineExceeded that the budget's
		// own timeout gave the attempt. Only the caller's deadline is told as
		// that.
		hookErr := st.lastErr
		if st.cut.reason == stopDeadline {
			hookErr = err
		}
		st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, Err: hookErr})
	}
	return errStopped
}

// readFinal reads a final answer's body. A body cut off mid-way is an error.
// So the attempt counts as unanswered and is retried with the same key. An
// incomplete answer is never taken for a success. An answer larger than the
// limit, header fields included, is final all the same. Asking again would
// only get it again. Its body is not kept.
func (st *call) readFinal(resp *http.Response) error {
	limit := st.cfg.maxBody - headerBytes(resp.Header)
	if limit < 0 {
		resp.Body.Close()
		st.oversized = true
		// An answer over the limit by its header fields alone is still checked
		// for the server's mark.
		return st.unmarked(resp, nil)
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

// redirectedKeyReuse stops the call, its outcome unknown, on the server's "key
// reused" answer. It applies after an attempt of the intent was redirected to
// another URL. The server fingerprints the path and the query. So the
// redirected request is another request to it, and it may have done the work.
// The answer says nothing of that work (stopRedirectedKeyReused). The call
// does not follow the redirect's URL itself. The lookup settles the intent on
// the server's word.
func (st *call) redirectedKeyReuse(resp *http.Response, body []byte) error {
	if st.stopped != nil || !st.redirected || !isFinal(resp.StatusCode, resp.Header, st.key) ||
		!st.cfg.keyReused(resp.StatusCode, resp.Header, body) {
		return nil
	}
	st.stopped = &stop{reason: stopRedirectedKeyReused}
	st.last = &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Attempts: st.b.attempts}
	st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: resp.StatusCode})
	return errStopped
}

// unmarked stops the call, its outcome unknown, when a final answer does not
// show that it is the server's word (see config.trustedAnswer). Otherwise it
// returns nil, and the answer is final. That holds for a 4xx on a first
// attempt too. A WAF's response rule may swap the server's 201 for its own 403
// after the server charged.
func (st *call) unmarked(resp *http.Response, body []byte) error {
	if st.stopped != nil || !isFinal(resp.StatusCode, resp.Header, st.key) {
		// Not a final answer: the budget or the context ended the call on it.
		return nil
	}
	st.own = st.cfg.trustedAnswer(resp, body, st.key)
	if st.own {
		return nil
	}
	st.stopped = &stop{reason: stopUnmarked}
	st.last = &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Attempts: st.b.attempts, Oversized: body == nil}
	if body == nil {
		st.last.Header = st.cfg.storedHeader(resp.Header)
	}
	st.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: resp.StatusCode})
	return errStopped
}

// keepLast keeps the body of the last retryable answer, for
// RetryError.LastResponse, when the call ends without a final one. It returns
// the call's error.
func (st *call) keepLast(resp *http.Response, err error) (*http.Response, error) {
	if st.last != nil && resp.StatusCode == st.last.StatusCode && (st.stopped == nil || st.stopped.reason != stopUnmarked && st.stopped.reason != stopRedirectedKeyReused) {
		limit := st.cfg.maxBody - headerBytes(resp.Header)
		switch {
		case st.finalBody != nil:
			st.last.Body = st.finalBody // read by the response handler
		case limit < 0:
			st.last.Header, st.last.Oversized = st.cfg.storedHeader(resp.Header), true
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

// logs reports whether the app's logger takes records of level under ctx. A
// line is built only then, so a silent logger costs no allocation.
func (c *config) logs(ctx context.Context, level slog.Level) bool {
	return c.logger != nil && c.logger.Enabled(ctx, level)
}

// attemptDone tells the attempt hook (Config.OnAttempt) and the app's logger
// (DEBUG) of the call's current attempt. It adds what the call knows of it:
// the intent's name and URL. It adds how long the attempt took on the Client's
// clock. The logger gets the caller's context.
func (st *call) attemptDone(a Attempt) {
	debug := st.cfg.logs(st.ctx.Context, slog.LevelDebug)
	if st.cfg.onAttempt == nil && !debug {
		return
	}
	if !st.urlRedacted {
		st.url, st.urlRedacted = redactURL(st.url), true
	}
	a.Name, a.URL, a.Err, a.Context = st.name, st.url, redactErr(a.Err), st.ctx.Context
	if !st.began.IsZero() {
		a.Duration = max(0, st.cfg.clock.Now().Sub(st.began))
	}
	if debug {
		st.cfg.logger.LogAttrs(st.ctx.Context, slog.LevelDebug, "idem: attempt",
			slog.String("key", a.Key), slog.Int("number", a.Number), slog.Int("status", a.StatusCode),
			slog.Any("error", a.Err), slog.Bool("retry", a.Retry), slog.Duration("wait", a.Wait))
	}
	// The attempt hook's call site.
	if st.cfg.onAttempt != nil {
		st.cfg.onAttempt(a)
	}
}

// logWait tells the app's logger (INFO) of the wait before the call's next
// attempt. It tells what the last one got, a status or err. It says so in
// words a person follows: "retrying in 3s, attempt 2 of 10".
func (st *call) logWait(wait time.Duration, status int, err error) {
	ctx := st.ctx.Context
	if !st.cfg.logs(ctx, slog.LevelInfo) {
		return
	}
	got := slog.String("got", fmt.Sprintf("%d %s", status, http.StatusText(status)))
	if err != nil {
		got = slog.String("got", redactErr(err).Error())
	}
	st.cfg.logger.LogAttrs(ctx, slog.LevelInfo,
		fmt.Sprintf("idem: retrying in %s, attempt %d of %d", wait.Round(time.Millisecond), st.b.attempts+1, st.b.policy.MaxAttempts),
		slog.String("key", st.key), slog.String("name", st.name), got)
}

// spendRetry asks the Client's retry budget for the retry that follows an
// attempt that failed with err. A nil err is a retryable answer. It returns
// why the call must stop instead, or nil.
func (st *call) spendRetry(err error) *stop {
	cost := st.tokens.take(st.cfg.clock.Now(), err)
	if cost == 0 {
		return &stop{reason: stopRetryBudget}
	}
	st.retryCost, st.paidFor = cost, st.b.attempts+1
	return nil
}

// unspendRetry puts back what the call took for a retry it never made. The
// call's context ended first, in the wait before it or as it began. No request
// went out for those tokens.
func (st *call) unspendRetry() {
	if st.paidFor > st.b.attempts {
		st.tokens.give(st.cfg.clock.Now(), st.retryCost)
		st.paidFor = 0
	}
}

// refundRetry puts back, after a final answer, what the retry that got it
// took. It puts back firstAnswerRefund when the first attempt got it. Only the
// server's word refunds, and only the server's word is final. A gateway's 401
// or a CDN's 404 to a first attempt never gets here. It ends the call unmarked
// (see unmarked). It says nothing of whether the server can take retries.
func (st *call) refundRetry() {
	n := st.retryCost
	if st.b.attempts <= 1 {
		n = firstAnswerRefund
	}
	st.tokens.give(st.cfg.clock.Now(), n)
}

// lefts returns how long the intent may still be sent and how long the call
// may still begin a send (sendDeadline), both on one reading of the clocks.
func (l *intentLeft) lefts() (window, send time.Duration) {
	r := l.clocks.read()
	return l.leftAt(r), (*sendDeadline)(l).leftAt(r)
}

// sendDeadline is the budget's reading of how long a call may still begin a
// send. The deadline is the one its record stores, in the claim that arm or
// hold writes. The reading is the least time any clock says is left. The
// budget's own clock stops while the device sleeps. The clock that counts
// sleep does not. No clock can let a send begin after the deadline. So another
// Client's lookup may count the reconcile delay from it.
type sendDeadline intentLeft

// leftAt is left on r, a reading of the clocks taken now.
func (l *sendDeadline) leftAt(r reading) time.Duration {
	if l.rec.Clocks == nil || l.rec.Clocks.SendWall.IsZero() {
		// An intent the store never holds (the RoundTripper's own).
		return math.MaxInt64
	}
	return sendByLeft(l.rec.Clocks, r, l.clocks.mark(r))
}
