package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/idemkit/idem/persist"
)

type intentKey struct{}

// ContextWithIntent returns a context that carries in. A request sent with
// it through the Client's RoundTripper uses in's key and stored record. So
// its retries survive restarts like those of Client.Do.
func ContextWithIntent(ctx context.Context, in *Intent) context.Context {
	return context.WithValue(ctx, intentKey{}, in)
}

// intentFromContext returns the intent carried by ctx, if any.
func intentFromContext(ctx context.Context) (*Intent, bool) {
	in, ok := ctx.Value(intentKey{}).(*Intent)
	return in, ok && in != nil
}

// HTTPRequest returns the exact request of an intent, as Do puts it on the
// wire. It has the intent's method, URL, stored headers and body bytes. Its
// Idempotency-Key is spelled as every attempt of it spells it. GetBody is
// set, so it may be sent more than once. It serves an http.Client that
// idem does not manage.
//
// HTTPRequest arms the intent first, as Do does. The answer the request
// gets is not recorded. The intent stays as it is until a Do, Settle or
// Reconcile through the Client. The server answers those from its record
// of the key. To have such a client's answers recorded, give it the
// Client's RoundTripper and a context from ContextWithIntent instead.
//
// A succeeded intent's request is handed out, and the server replays its
// answer. Any other resolved intent (void, failed, rejected) is refused,
// and nothing changes. The server may hold no record of its key, so its
// request would do the work anew. NewIntent makes a new intent to do the
// action again. An intent stored not sent is handed out as a send again
// arms it. Its age, and the server's retention of its key, start again.
//
// Send the request while the intent is young enough. That is younger than
// Server.Retention less Server.RetentionMargin, 23 hours by default. The
// age counts from the tap, or from this hand-out for an intent stored not
// sent. Do not keep the request longer. A request sent after the server
// forgot its key is done anew. Ask HTTPRequest again instead. It refuses
// an intent too old to send. An unresolved one is then stored expired, and
// the error matches ErrOutcomeUnknown. Settle or Reconcile settles it.
//
// A store's read or write may fail after the intent was armed. That error
// comes with no request and matches ErrOutcomeUnknown. Nothing was handed
// out, but the intent is armed. A later Do or SettleAll may send it.
func (c *Client) HTTPRequest(ctx context.Context, in *Intent) (*http.Request, error) {
	if !in.made() {
		return nil, errors.New("idem: HTTPRequest with a nil or zero intent: " + madeBy)
	}
	// The request leaves the Client's hands. So the intent is armed, and
	// stored as handed out, first.
	if err := c.handOut(ctx, in); err != nil {
		return nil, err
	}
	rec := in.current()
	req, err := http.NewRequestWithContext(ctx, rec.Method, rec.URL, bytes.NewReader(rec.Body))
	if err != nil {
		return nil, fmt.Errorf("idem: building the request of intent %s: %w", rec.Key, err)
	}
	for k, v := range rec.Header {
		req.Header[k] = append([]string(nil), v...)
	}
	req.Header.Set("Idempotency-Key", rec.KeyHeader)
	return req, nil
}

// ErrNoIdentity means a POST or PATCH sent through the Client's
// RoundTripper states no intent. Nothing was sent. The RoundTripper never
// guesses an intent, and never makes a fresh key for such a request. An
// API client may send it again after a lost answer. It may pass through a
// transport that clones it. A fresh key would then pay twice. Name the
// request's action with ContextWithAction. Or pass its intent with
// ContextWithIntent, or set its own Idempotency-Key.
var ErrNoIdentity = errors.New("idem: a POST or PATCH through the RoundTripper states no intent: name its action (ContextWithAction), pass its intent (ContextWithIntent) or set its Idempotency-Key")

// ErrRequestTooLarge means a request's body through the RoundTripper is
// over MaxRequestBodyBytes. Nothing was sent.
var ErrRequestTooLarge = errors.New("idem: the request's body is over MaxRequestBodyBytes")

// MaxRequestBodyBytes is the largest body the RoundTripper sends. Every
// attempt sends the same bytes, so the RoundTripper holds them. An
// action's intent stores them on the device too. A larger body is refused
// with ErrRequestTooLarge before anything is sent. It is never read whole.
// One whose ContentLength says so is not read at all. A stream is read to
// one byte past the limit.
const MaxRequestBodyBytes = 10 << 20

type actionKey struct{}

// ContextWithAction returns a context that names the action of a POST or
// PATCH sent with it through the Client's RoundTripper. The name is as
// Client.Intent takes it. The RoundTripper takes the action's intent for
// the request as Intent does. It arms it as Do does. So the same request
// is the same intent with the same key, sent again, cloned or copied.
// req.Clone keeps the context. Its retries survive restarts.
//
// A changed request follows Intent's rules. It replaces an intent never
// sent. It is refused (*UnresolvedError, *ResolvedError) while the
// action's latest intent may have been sent or was paid. The intent stores
// the request's method, URL and body. Of its header fields it stores
// Content-Type, Content-Encoding, Content-Language and Accept. The other
// fields, credentials among them, go on the wire only.
func ContextWithAction(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, actionKey{}, name)
}

// actionFromContext returns the action named by ctx, if any.
func actionFromContext(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(actionKey{}).(string)
	return name, ok && name != ""
}

// storedRequestFields are the header fields an action's intent made by the
// RoundTripper keeps. The server needs them to read the body again after
// a restart. Anything else may be a credential, which the device never
// stores.
var storedRequestFields = []string{"Content-Type", "Content-Encoding", "Content-Language", "Accept"}

// RoundTripper returns an http.RoundTripper that sends POST and PATCH
// requests with an Idempotency-Key. It retries them under the Client's
// policy. So any *http.Client, such as a generated API client, gets safe
// retries:
//
//	hc := &http.Client{Transport: client.RoundTripper(http.DefaultTransport)}
//	ctx := idem.ContextWithAction(ctx, "checkout-"+cartID)
//
// A request's identity is what the app states, never which object it is.
// So a clone keeps it, as does a request sent again. The RoundTripper
// looks for it in this order:
//
//   - an intent in the request's context (ContextWithIntent), which must
//     be the request's, else ErrIntentMismatch;
//   - the request's own Idempotency-Key, which may name a stored intent,
//     or else is kept in memory for this call only;
//   - an action named in the request's context (ContextWithAction).
//
// A POST or PATCH that states none is refused with ErrNoIdentity. One
// whose body is over MaxRequestBodyBytes is refused with
// ErrRequestTooLarge. Nothing is sent then. The live request's header
// fields go on the wire with the intent's key. Credentials set by the
// caller's transports are among them.
//
// A final answer, 4xx included, is returned as the response. A 301, 302
// or 303 is handed back to the app's http.Client. Its GET carries no key
// and no intent. That GET is sent only after a 303 the server marked.
// After any other, the GET fails with the call's error, which wraps
// *RetryError. So no login page reaches the app as its payment's answer.
// Any other unknown outcome is an error that matches ErrOutcomeUnknown.
// When the attempts left it unknown, the error wraps *RetryError too. A
// failed store or a dispute over a void says so instead. Other methods
// pass through to base untouched, and never carry a key. base nil means
// http.DefaultTransport. The RoundTripper is safe for concurrent use.
//
// docs/CLIENT.md, "Sending through any http.Client", tells each case in
// full.
func (c *Client) RoundTripper(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &roundTripper{c: c, base: base, retry: newRetrier(&http.Client{Transport: base})}
}

type roundTripper struct {
	c     *Client
	base  http.RoundTripper
	retry *retrier // sends each attempt through base

	// callers holds the in-memory intent of each caller's own key, until
	// it resolves. Such a key names no stored intent. The caller's retry
	// of the same request, however much later, is the same intent. Its
	// age counts from its first send. So it is not sent past the server's
	// retention. A restart forgets them.
	mu      sync.Mutex
	callers map[string]*Intent
}

func (t *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost && req.Method != http.MethodPatch {
		if err := followsUnknown(req); err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
		return t.base.RoundTrip(keyless(req))
	}
	ctx := req.Context()
	if err := t.refuse(req); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	body, err := readRequestBody(req)
	if err != nil {
		return nil, err
	}
	live := Request{Method: req.Method, URL: req.URL.String(), Header: req.Header, Body: body}
	if err := checkHeader(live.Header); err != nil {
		// The live header goes on the wire, stored or not.
		return nil, err
	}
	in, err := t.intentFor(ctx, req, live)
	if err != nil {
		return nil, err
	}

	// The live request's headers go on the wire, credentials set by the
	// caller's client included. Its key gives way to the intent's.
	header := req.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	header.Del("Idempotency-Key")
	flight := in.Key()
	if in.ephemeral {
		// Calls that share a caller's key but not a request are not one.
		flight += " " + in.current().Fingerprint
	}
	resp, err := t.c.flights.do(ctx, flight, func() (*Response, error) { return t.c.do(ctx, in, t.retry, header) })
	err = forCall(err, callRoundTripper)
	t.settled(in)
	if resp == nil {
		if last := handedBack(err); last != nil {
			// A 301, 302 or unmarked 303 is the app's client's to follow.
			// The intent's outcome stays unknown. Its GET carries no key.
			resp := httpResponse(req, last)
			resp.Body = &handedBackBody{Reader: bytes.NewReader(last.Body), err: err}
			return resp, nil
		}
		return nil, err
	}
	// A response is a final answer. An *APIError only interprets it. A
	// *SaveError leaves the intent unresolved on the device. There the
	// next Do replays the server's stored answer. Either way the answer is
	// returned, as a RoundTripper must.
	return httpResponse(req, resp), nil
}

// refuse returns why req cannot be sent, before its body is read. It may
// state no identity (ErrNoIdentity). Its body may be known to be over
// MaxRequestBodyBytes. Or its context may carry a bad RetryPolicy.
func (t *roundTripper) refuse(req *http.Request) error {
	ctx := req.Context()
	if err := checkPolicy(ctx); err != nil {
		return err
	}
	_, hasIntent := intentFromContext(ctx)
	_, hasAction := actionFromContext(ctx)
	if !hasIntent && !hasAction && req.Header.Get("Idempotency-Key") == "" {
		return fmt.Errorf("%w (%s %s)", ErrNoIdentity, req.Method, redactURL(req.URL.String()))
	}
	if req.ContentLength > MaxRequestBodyBytes {
		return fmt.Errorf("%w: %d bytes (%s %s)", ErrRequestTooLarge, req.ContentLength, req.Method, redactURL(req.URL.String()))
	}
	return nil
}

// intentFor returns the intent that req, whose bytes are live, states.
// RoundTripper tells how. A stored intent is armed.
func (t *roundTripper) intentFor(ctx context.Context, req *http.Request, live Request) (*Intent, error) {
	in, ok := intentFromContext(ctx)
	k := req.Header.Get("Idempotency-Key")
	if !ok && k != "" {
		// A request that carries a stored intent's key is that intent.
		switch stored, err := t.c.Load(ctx, k); {
		case err == nil:
			in, ok = stored, true
		case !errors.Is(err, persist.ErrNotFound):
			return nil, err
		}
	}
	if !ok && k == "" {
		// The action's intent for this request, as Intent finds or makes
		// it. The same request is the same intent, whatever object carries
		// it.
		name, _ := actionFromContext(ctx)
		kept := Request{Method: live.Method, URL: live.URL, Body: live.Body}
		for _, f := range storedRequestFields {
			if vs := live.Header.Values(f); len(vs) > 0 {
				if kept.Header == nil {
					kept.Header = http.Header{}
				}
				kept.Header[f] = vs
			}
		}
		var err error
		if in, err = t.c.Intent(ctx, name, kept); err != nil {
			return nil, err
		}
		ok = true
	}
	if ok {
		if !in.matches(live) {
			return nil, fmt.Errorf("%w: intent %s, request %s %s", ErrIntentMismatch, in.Key(), req.Method, req.URL.Redacted())
		}
		if err := t.c.arm(ctx, in); err != nil {
			return nil, err
		}
		return in, nil
	}
	// The caller's own key names no stored intent. An API client may
	// retry with it after an error. Every attempt carries it.
	t.mu.Lock()
	defer t.mu.Unlock()
	if in := t.callers[k]; in != nil && in.matches(live) {
		return in, nil
	}
	if err := live.validate(); err != nil {
		return nil, err
	}
	rec, err := t.c.newRecord("", live, live.fingerprint(), 1, t.c.clock.Now())
	if err != nil {
		return nil, err
	}
	rec.Key, rec.KeyHeader = k, k
	in = &Intent{rec: rec, ephemeral: true, callersKey: true, unsent: t.c.keys}
	if t.callers[k] == nil {
		// The first request under the key is the one whose age counts.
		// The server refuses another request under it (key reused).
		if t.callers == nil {
			t.callers = make(map[string]*Intent)
		}
		t.callers[k] = in
	}
	return in, nil
}

// settled forgets the caller's key of in once in is resolved.
func (t *roundTripper) settled(in *Intent) {
	if !in.ephemeral || !in.current().State.Resolved() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.callers[in.Key()] == in {
		delete(t.callers, in.Key())
	}
}

// handedBack returns the redirect that ended a call, when the app's
// http.Client is to follow it. That is a 301, 302 or unmarked 303. The
// client's GET then fetches what it names. A 307 or 308 that reached the
// client was not followed on purpose, from https to http. Other 3xx name
// nothing to fetch. Those stay errors.
func handedBack(err error) *Response {
	var re *RetryError
	if !errors.As(err, &re) || re.Reason != stopRedirect || re.LastResponse == nil {
		return nil
	}
	switch re.LastResponse.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther:
		return re.LastResponse
	}
	return nil
}

// handedBackBody is the body of a redirect handed back to the app's
// http.Client with the intent's outcome unknown. It carries the call's
// error to the GET that follows it.
type handedBackBody struct {
	*bytes.Reader
	err error
}

func (*handedBackBody) Close() error { return nil }

// followsUnknown returns why req is not sent. req is the GET an
// http.Client makes to follow a redirect this RoundTripper handed back.
// The redirect left the payment's outcome unknown. The page it names
// would reach the app as its payment's answer, with no error. A captive
// portal's login page is such a page. The app's client still sees the
// redirect itself (CheckRedirect, http.ErrUseLastResponse).
func followsUnknown(req *http.Request) error {
	if req.Response == nil {
		return nil
	}
	b, ok := req.Response.Body.(*handedBackBody)
	if !ok {
		return nil
	}
	return fmt.Errorf("idem: the %d to %s is not followed: %w", req.Response.StatusCode, redactURL(req.URL.String()), b.err)
}

// httpResponse is resp as the answer to req.
func httpResponse(req *http.Request, resp *Response) *http.Response {
	return &http.Response{
		Status:        strconv.Itoa(resp.StatusCode) + " " + http.StatusText(resp.StatusCode),
		StatusCode:    resp.StatusCode,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        resp.Header,
		Body:          io.NopCloser(bytes.NewReader(resp.Body)),
		ContentLength: int64(len(resp.Body)),
		Request:       req,
	}
}

// keyless returns req without an Idempotency-Key when it is the GET (or
// HEAD) an http.Client makes to follow a redirect. The client copies the
// request's header fields, the app's own key among them. A GET never
// carries a key.
func keyless(req *http.Request) *http.Request {
	if req.Response == nil || req.Header.Get("Idempotency-Key") == "" {
		return req
	}
	out := req.Clone(req.Context())
	out.Header.Del("Idempotency-Key")
	return out
}

// readRequestBody returns req's body. It refuses one over
// MaxRequestBodyBytes, having read one byte past it at most.
func readRequestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	src := req.Body
	if req.GetBody != nil {
		// A fresh copy gives a request sent again its bytes. That holds
		// even when the caller did not rewind its Body.
		if b, err := req.GetBody(); err == nil {
			defer b.Close()
			src = b
		}
	}
	body, err := readAtMost(src, req.ContentLength, MaxRequestBodyBytes)
	if errors.Is(err, ErrRequestTooLarge) {
		return nil, fmt.Errorf("%w (%s %s)", err, req.Method, redactURL(req.URL.String()))
	}
	if err != nil {
		return nil, fmt.Errorf("idem: reading request body: %w", err)
	}
	return body, nil
}

// readAtMost reads r to its end, as io.ReadAll does. It fails with
// ErrRequestTooLarge past limit bytes. size is the length r says it has,
// or 0 or less when unknown. It sizes the buffer. So a body of the length
// it states is read into one allocation.
func readAtMost(r io.Reader, size, limit int64) ([]byte, error) {
	n := int64(512)
	if size > 0 {
		n = min(size, limit) + 1 // the extra byte sees the end
	}
	b := make([]byte, 0, n)
	for {
		if int64(len(b)) > limit {
			return nil, ErrRequestTooLarge
		}
		if len(b) == cap(b) {
			// Doubled, never past the byte that tells the limit is
			// passed. So at most about twice the limit is allocated.
			grown := make([]byte, len(b), min(2*int64(cap(b)), limit+1))
			copy(grown, b)
			b = grown
		}
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			if int64(len(b)) > limit {
				return nil, ErrRequestTooLarge
			}
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
