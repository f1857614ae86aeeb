package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem/persist"
)

// Defaults of a Client; each can be changed with an Option.
const (
	// DefaultRetention is the server's retention of idempotency records
	// that the client assumes (the contract's default).
	DefaultRetention = 24 * time.Hour
	// DefaultSafetyMargin is how long before the server's retention ends
	// the client stops sending a key.
	DefaultSafetyMargin = time.Hour
	// DefaultReconcileDelay is how long after an intent's last attempt a
	// "not found" from the server's lookup is trusted to mean "never done".
	// It must exceed the server's lease plus the longest processing time.
	DefaultReconcileDelay = 2 * time.Minute
	// DefaultMaxResponseBytes bounds the body read from one answer.
	DefaultMaxResponseBytes = 10 << 20
)

// Client sends intents. It stores each intent before its first attempt,
// retries with the same key and bytes, and stores the final answer.
//
// A Client is safe for concurrent use by multiple goroutines. Two calls of
// Do for the same intent never put two requests on the wire at once: the
// second waits for the first and gets the same outcome. One store should be
// used by one Client at a time.
type Client struct {
	http      *http.Client
	store     persist.Store
	logger    *slog.Logger // nil: silent
	clock     Clock
	policy    RetryPolicy
	retention time.Duration
	margin    time.Duration
	reconcile time.Duration
	maxBody   int64
	quoted    bool
	onAttempt func(Attempt)
	retry     *retryablehttp.Client // sends through http

	flights flights
	latest  latest
	// intentMu serialises the decision "reuse or create" per Client.
	intentMu sync.Mutex
	// unsent holds the keys this Client created and has not yet handed to
	// Do: the only intents known for certain never to have been sent.
	sentMu sync.Mutex
	unsent map[string]struct{}
	// dropped holds the keys of unsent intents that Intent replaced; Do
	// refuses to send them.
	dropped map[string]struct{}
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends through hc, so the app keeps its transport, proxies,
// TLS settings, tracing and per-attempt Timeout. The default is an
// http.Client on http.DefaultTransport with a 30s timeout per attempt.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithStore keeps intents in s. The default is persist.NewMemory(nil),
// which does not survive a restart; use persist.OpenDir on a device.
func WithStore(s persist.Store) Option { return func(c *Client) { c.store = s } }

// WithLogger logs retries and outcomes to l. The default is silence.
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.logger = l } }

// WithClock replaces the system clock, for tests of waiting.
func WithClock(clk Clock) Option { return func(c *Client) { c.clock = clk } }

// WithRetryPolicy sets when to retry and how long to wait.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *Client) { c.policy = p } }

// WithRetention tells the client how long the server keeps idempotency
// records, and how long before that it must stop sending a key. An intent
// older than retention-margin is not sent again: its outcome is reported
// unknown (ErrIntentExpired) and Reconcile settles it. Zero values mean
// DefaultRetention and DefaultSafetyMargin.
func WithRetention(retention, margin time.Duration) Option {
	return func(c *Client) { c.retention, c.margin = retention, margin }
}

// WithReconcileDelay sets how long after an intent's last attempt a "not
// found" from the lookup in Reconcile is trusted. Zero means
// DefaultReconcileDelay.
func WithReconcileDelay(d time.Duration) Option { return func(c *Client) { c.reconcile = d } }

// WithMaxResponseBytes bounds the body read from one answer; a larger body
// ends the call with an error. Zero means DefaultMaxResponseBytes.
func WithMaxResponseBytes(n int64) Option { return func(c *Client) { c.maxBody = n } }

// WithQuotedKey sends the key as an RFC 8941 sf-string ("..."), as the IETF
// draft writes it. The default is the bare value deployed APIs expect.
func WithQuotedKey() Option { return func(c *Client) { c.quoted = true } }

// WithAttemptHook calls f after every attempt with its outcome and the wait
// chosen before the next one. f runs on the goroutine of Do and must not
// block.
func WithAttemptHook(f func(Attempt)) Option { return func(c *Client) { c.onAttempt = f } }

// New returns a Client. With no options it keeps intents in memory only,
// which is right for tests and wrong on a device: pass WithStore.
func New(opts ...Option) (*Client, error) {
	c := &Client{}
	for _, o := range opts {
		o(c)
	}
	if c.http == nil {
		c.http = &http.Client{Timeout: 30 * time.Second}
	}
	if c.store == nil {
		c.store = persist.NewMemory(nil)
	}
	if c.clock == nil {
		c.clock = systemClock{}
	}
	c.policy = c.policy.withDefaults()
	if c.retention == 0 {
		c.retention = DefaultRetention
	}
	if c.margin == 0 {
		c.margin = DefaultSafetyMargin
	}
	if c.retention < 0 || c.margin < 0 || c.margin >= c.retention {
		return nil, fmt.Errorf("idem: retention %s with margin %s leaves no time to send", c.retention, c.margin)
	}
	if c.reconcile <= 0 {
		c.reconcile = DefaultReconcileDelay
	}
	if c.maxBody <= 0 {
		c.maxBody = DefaultMaxResponseBytes
	}
	c.retry = c.newRetryClient(c.http)
	return c, nil
}

// Response is the final answer to an intent.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	// Replayed is true when the server answered from its idempotency
	// record (Idempotent-Replayed: true): the work was done by an earlier
	// attempt, whose answer had been lost.
	Replayed bool
	// Attempts is how many attempts this call put on the wire; 0 when the
	// answer came from the device's store.
	Attempts int
	// FromStore is true when the intent was already resolved and nothing
	// was sent.
	FromStore bool
}

func responseFromStored(r *persist.Response, attempts int, fromStore bool) *Response {
	return &Response{
		StatusCode: r.StatusCode,
		Header:     r.Header.Clone(),
		Body:       bytes.Clone(r.Body),
		Replayed:   r.Replayed,
		Attempts:   attempts,
		FromStore:  fromStore,
	}
}

func (r *Response) clone() *Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = bytes.Clone(r.Body)
	return &c
}

// Do sends the intent and returns its final answer.
//
// A resolved intent is not sent: Do returns the stored answer with
// FromStore set. An unresolved one is sent with its key and exact bytes,
// and retried under the Client's RetryPolicy. A 2xx answer returns the
// Response and a nil error. Any other final answer (a declined card, a
// 422) returns the Response and an *APIError; it is stored and never
// retried. When no final answer arrives, Do returns a *RetryError matching
// ErrOutcomeUnknown and the intent stays unresolved: Do it again later.
func (c *Client) Do(ctx context.Context, in *Intent) (*Response, error) {
	if in == nil {
		return nil, errors.New("idem: Do with a nil intent")
	}
	return c.flights.do(ctx, in.Key(), func() (*Response, error) { return c.do(ctx, in, c.retry, nil) })
}

// do runs one call for in through rc. header, if not nil, replaces the
// stored headers (the RoundTripper sends the live request's).
func (c *Client) do(ctx context.Context, in *Intent, rc *retryablehttp.Client, header http.Header) (*Response, error) {
	cur := in.current()
	// The store is the truth: another Intent value for this key, or an
	// earlier process, may have moved an unresolved intent on. A resolved
	// one never changes, and one that holds the version this Client saved
	// last is current: neither needs the read.
	if !in.ephemeral && !cur.State.Resolved() && !c.latest.is(cur) {
		stored, err := c.store.Get(ctx, cur.Key)
		if err != nil {
			return nil, fmt.Errorf("idem: loading intent %s: %w", cur.Key, err)
		}
		in.set(stored)
		cur = stored
	}
	if cur.State.Resolved() {
		return c.storedOutcome(cur)
	}
	// rec is this call's next version of the record.
	next := *cur
	rec := &next
	expiry := rec.CreatedAt.Add(c.retention - c.margin)
	if !c.clock.Now().Before(expiry) {
		err := &RetryError{Key: rec.Key, Reason: StopExpired}
		if rec.State != persist.StateExpired {
			rec.State = persist.StateExpired
			rec.UpdatedAt = c.clock.Now()
			if saveErr := c.save(ctx, in, rec, "record expiry"); saveErr != nil {
				return nil, errors.Join(err, saveErr)
			}
		}
		return nil, err
	}
	if err := c.markSent(rec.Key); err != nil {
		return nil, err
	}

	if header == nil {
		header = rec.Header
	}
	resp, retryErr := c.send(ctx, rc, rec, header, expiry)
	now := c.clock.Now()
	if retryErr != nil {
		rec.Attempts += retryErr.Attempts
		rec.UpdatedAt = now
		if retryErr.Reason == StopExpired {
			rec.State = persist.StateExpired
		} else if retryErr.Attempts > 0 {
			rec.State = persist.StatePending
		}
		c.log(ctx, slog.LevelWarn, "idem: outcome unknown", "key", rec.Key, "attempts", retryErr.Attempts, "reason", string(retryErr.Reason))
		// The save records what is known; if it fails, the intent stays
		// unresolved in the store anyway, which is the safe side.
		if retryErr.Attempts > 0 || retryErr.Reason == StopExpired {
			if saveErr := c.save(context.WithoutCancel(ctx), in, rec, "record attempts"); saveErr != nil {
				return nil, errors.Join(retryErr, saveErr)
			}
		}
		return nil, retryErr
	}

	rec.Attempts += resp.Attempts
	rec.UpdatedAt = now
	rec.State = stateFor(resp.StatusCode, resp.Header, resp.Body)
	// The caller owns resp; the record keeps its own copy.
	rec.Response = &persist.Response{StatusCode: resp.StatusCode, Header: resp.Header.Clone(), Body: bytes.Clone(resp.Body), Replayed: resp.Replayed}
	if c.logger != nil { // skip building the arguments when silent
		c.log(ctx, slog.LevelInfo, "idem: resolved", "key", rec.Key, "status", resp.StatusCode, "attempts", resp.Attempts, "replayed", resp.Replayed)
	}
	// The answer is final whatever happens to the save: the server keeps
	// it and replays it to the next Do. Save even if ctx is done now, so a
	// cancel right after the answer does not cost the record.
	saveErr := c.save(context.WithoutCancel(ctx), in, rec, "record outcome")
	apiErr := apiErrorFor(rec, resp)
	switch {
	case apiErr != nil && saveErr != nil:
		return resp, errors.Join(apiErr, saveErr)
	case apiErr != nil:
		return resp, apiErr
	case saveErr != nil:
		return resp, saveErr
	}
	return resp, nil
}

// storedOutcome answers Do for a resolved intent without sending.
func (c *Client) storedOutcome(rec *persist.Record) (*Response, error) {
	if rec.Response == nil {
		// Resolved without an answer: reconciled as never done.
		return nil, fmt.Errorf("idem: intent %s is %s: the server has no effect for its key; create a new intent to try again", rec.Key, rec.State)
	}
	resp := responseFromStored(rec.Response, 0, true)
	if err := apiErrorFor(rec, resp); err != nil {
		return resp, err
	}
	return resp, nil
}

// save makes rec the intent's current version and stores it. rec must not
// be changed afterwards.
func (c *Client) save(ctx context.Context, in *Intent, rec *persist.Record, op string) error {
	in.set(rec)
	if in.ephemeral {
		return nil
	}
	if err := c.store.Save(ctx, rec); err != nil {
		c.latest.forget(rec.Key)
		c.log(ctx, slog.LevelError, "idem: save failed", "key", rec.Key, "op", op, "error", err)
		return &SaveError{Key: rec.Key, Op: op, Err: err}
	}
	c.latest.saved(rec)
	return nil
}

// latest remembers the version of each unresolved intent that this Client
// saved last, so that Do can tell an Intent that holds it from a stale one
// without reading the store. Resolved intents are dropped: they never
// change, so it holds only unresolved ones.
type latest struct {
	mu sync.Mutex
	m  map[string]*persist.Record
}

func (l *latest) saved(rec *persist.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec.State.Resolved() {
		delete(l.m, rec.Key)
		return
	}
	if l.m == nil {
		l.m = make(map[string]*persist.Record)
	}
	l.m[rec.Key] = rec
}

func (l *latest) forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

func (l *latest) is(rec *persist.Record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[rec.Key] == rec
}

// stateFor classifies a final answer.
func stateFor(status int, header http.Header, body []byte) persist.State {
	switch {
	case status >= 200 && status < 300:
		return persist.StateSucceeded
	case status == http.StatusUnprocessableEntity,
		isKeyProblem(status, parseProblem(header, body).Type):
		return persist.StateRejected
	}
	return persist.StateFailed
}

func apiErrorFor(rec *persist.Record, resp *Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return &APIError{
		Method:     rec.Method,
		URL:        rec.URL,
		Key:        rec.Key,
		StatusCode: resp.StatusCode,
		Problem:    parseProblem(resp.Header, resp.Body),
		Response:   resp,
	}
}

func (c *Client) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if c.logger != nil {
		c.logger.Log(ctx, level, msg, args...)
	}
}

func (c *Client) keyHeader(key string) string {
	if !c.quoted {
		return key
	}
	v, err := httpsfv.Marshal(httpsfv.NewItem(key))
	if err != nil {
		// Keys are made of visible ASCII, which every sf-string can hold.
		return key
	}
	return v
}

var (
	errBodyTooLarge = errors.New("idem: response body too large")
	// errStopped tells retryablehttp to stop; the reason is in the call's
	// state.
	errStopped = errors.New("idem: retry budget exhausted")
)

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
func (c *Client) newRetryClient(hc *http.Client) *retryablehttp.Client {
	rc := &retryablehttp.Client{
		HTTPClient:     noKeyOnRedirect(hc),
		RetryMax:       math.MaxInt32, // the budget decides
		RequestLogHook: countAttempt,
		CheckRetry:     checkRetry,
		Backoff:        func(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 },
		ErrorHandler:   keepLastAnswer,
	}
	if c.logger != nil {
		rc.Logger = c.logger
	}
	return rc
}

// noKeyOnRedirect returns a copy of hc that drops the Idempotency-Key from
// a redirect that is not a POST or PATCH: net/http follows a 301, 302 or
// 303 after a POST with a GET and copies the headers, and a GET never
// carries a key. hc's own CheckRedirect, if any, still decides.
func noKeyOnRedirect(hc *http.Client) *http.Client {
	cp := *hc
	check := hc.CheckRedirect
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.Method != http.MethodPost && req.Method != http.MethodPatch {
			req.Header.Del("Idempotency-Key")
		}
		if check != nil {
			return check(req, via)
		}
		if len(via) >= 10 { // net/http's default
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &cp
}

// call is the state of one call of send, reached by the hooks through the
// request's context. It is confined to that call's goroutine.
type call struct {
	c         *Client
	key       string
	b         *budget
	finalBody []byte    // the body of the last answer read in full
	stopped   *stop     // why the budget ended the call, once it did
	last      *Response // the last retryable answer
	lastErr   error
}

type callKey struct{}

func callOf(ctx context.Context) *call { return ctx.Value(callKey{}).(*call) }

func countAttempt(_ retryablehttp.Logger, req *http.Request, _ int) {
	// After a cancel, retryablehttp may still start an attempt, which fails
	// at once without reaching the wire.
	if req.Context().Err() == nil {
		callOf(req.Context()).b.attempts++
	}
}

// checkRetry decides after each attempt. retryablehttp may call it twice for
// one attempt (again after the response handler); once the call is stopped
// it keeps saying so.
func checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	st := callOf(ctx)
	if st.stopped != nil {
		return false, errStopped
	}
	if err == nil && !retryableStatus(resp.StatusCode) {
		// A final answer is taken even if ctx ended as it arrived: its
		// body may be read yet, and it saves a resend.
		return false, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return false, ctxErr
	}
	status := 0
	if err == nil {
		status = resp.StatusCode
		st.last = &Response{StatusCode: resp.StatusCode, Header: resp.Header, Attempts: st.b.attempts}
	} else {
		st.last = nil
		if !retryableError(err) {
			st.stopped = &stop{reason: StopFatal}
			st.c.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, Err: err})
			return false, err
		}
	}
	st.lastErr = err
	var retryResp *http.Response
	if err == nil {
		retryResp = resp
	}
	wait, stopped := st.b.next(retryResp)
	st.c.attemptDone(Attempt{Key: st.key, Number: st.b.attempts, StatusCode: status, Err: err, Retry: stopped == nil, Wait: wait})
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
// key: an incomplete answer is never taken for a success.
func readFinal(resp *http.Response) error {
	st := callOf(resp.Request.Context())
	body, err := readBody(resp.Body, st.c.maxBody)
	if err != nil {
		return err
	}
	st.finalBody = body
	return nil
}

func keepLastAnswer(resp *http.Response, err error, _ int) (*http.Response, error) {
	if resp == nil {
		return nil, err
	}
	st := callOf(resp.Request.Context())
	if st.last != nil && resp.StatusCode == st.last.StatusCode {
		if st.finalBody != nil {
			st.last.Body = st.finalBody // read by the response handler
		} else {
			st.last.Body, _ = readBody(resp.Body, st.c.maxBody)
		}
	}
	resp.Body.Close()
	return nil, err
}

// send makes the attempts of one call through go-retryablehttp. It returns
// a final answer, or a *RetryError when none came.
func (c *Client) send(ctx context.Context, rc *retryablehttp.Client, rec *persist.Record, header http.Header, expiry time.Time) (*Response, *RetryError) {
	st := &call{c: c, key: rec.Key, b: newBudget(ctx, c.policy, c.clock, expiry)}
	fail := func(reason StopReason, err error) *RetryError {
		return &RetryError{Key: rec.Key, Reason: reason, Attempts: st.b.attempts, Elapsed: st.b.elapsed(), Err: err}
	}

	req, err := retryablehttp.NewRequestWithContext(context.WithValue(ctx, callKey{}, st), rec.Method, rec.URL, rec.Body)
	if err != nil {
		return nil, fail(StopFatal, err)
	}
	if header != nil {
		req.Header = header.Clone()
	}
	req.Header.Set("Idempotency-Key", c.keyHeader(rec.Key))
	req.SetResponseHandler(readFinal)

	resp, err := rc.Do(req)
	if err == nil {
		resp.Body.Close()
		out := &Response{
			StatusCode: resp.StatusCode,
			Header:     resp.Header,
			Body:       st.finalBody,
			Replayed:   resp.Header.Get("Idempotent-Replayed") == "true",
			Attempts:   st.b.attempts,
		}
		c.attemptDone(Attempt{Key: rec.Key, Number: st.b.attempts, StatusCode: resp.StatusCode})
		return out, nil
	}

	switch {
	case st.stopped != nil && st.stopped.reason != StopFatal:
		e := fail(st.stopped.reason, st.lastErr)
		e.Wait = st.stopped.wait
		e.LastResponse = st.last
		return nil, e
	case ctx.Err() != nil:
		reason := StopCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			reason = StopDeadline
		}
		e := fail(reason, ctx.Err())
		e.LastResponse = st.last
		return nil, e
	}
	return nil, fail(StopFatal, err)
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

// flights lets one Do per key run at a time; later callers for the same key
// wait and share its outcome.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done chan struct{}
	// exclusive flights (Reconcile, Forget) share no result: a Do waits for
	// them and then makes its own call.
	exclusive bool
	waiters   int // guarded by flights.mu
	resp      *Response
	err       error
}

func (f *flights) do(ctx context.Context, key string, fn func() (*Response, error)) (*Response, error) {
	f.mu.Lock()
	for {
		cur, ok := f.m[key]
		if !ok {
			break
		}
		if !cur.exclusive {
			cur.waiters++
		}
		f.mu.Unlock()
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if !cur.exclusive {
			return cur.resp.clone(), cur.err
		}
		// A Reconcile or Forget held the key: now make this call's own,
		// which reads what it left in the store.
		f.mu.Lock()
	}
	cur := f.start(key, false)
	f.mu.Unlock()

	var resp *Response
	// Should fn panic, the waiters get this error rather than nothing.
	err := errors.New("idem: the concurrent Do for this intent did not finish")
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		if cur.waiters > 0 {
			// Waiters get their own copy, so no two callers share a body.
			cur.resp, cur.err = resp.clone(), err
		}
		f.mu.Unlock()
		close(cur.done)
	}()
	resp, err = fn()
	return resp, err
}

// exclusive runs fn holding key, so that no Do for key runs meanwhile (a
// Do that arrives waits, then runs on its own), and reports true; or, if a
// call for key is under way, runs nothing and reports false.
func (f *flights) exclusive(key string, fn func()) bool {
	f.mu.Lock()
	if _, ok := f.m[key]; ok {
		f.mu.Unlock()
		return false
	}
	cur := f.start(key, true)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		f.mu.Unlock()
		close(cur.done)
	}()
	fn()
	return true
}

// start registers a flight for key; f.mu is held.
func (f *flights) start(key string, exclusive bool) *flight {
	if f.m == nil {
		f.m = make(map[string]*flight)
	}
	cur := &flight{done: make(chan struct{}), exclusive: exclusive}
	f.m[key] = cur
	return cur
}
