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
// it through the Client's RoundTripper uses in's key and stored record, so
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
// wire: its method, URL, stored headers and body bytes, and its
// Idempotency-Key spelled as every attempt of it spells it, with GetBody
// set so that it may be sent more than once. It is for sending an intent
// through an http.Client that idem does not manage. The answer it gets is
// not recorded: the intent (armed first, as by Do) stays as it is until a Do, Settle or Reconcile
// through the Client, which the server answers from its record of the key.
// To have such a client's answers recorded, give it the Client's
// RoundTripper and a context from ContextWithIntent instead.
//
// A succeeded intent's request is handed out: the server replays its
// answer. Any other resolved intent (void, failed, rejected) is refused
// with an error, and nothing changes: the server may hold no record of
// its key, so its request, sent, would do the work anew. Create a new
// intent (NewIntent) to do the action again. An intent stored not sent is
// handed out as a send again arms it: its age, and the server's retention
// of its key, start again now.
//
// Send the request while the intent is younger than the server's retention
// less its margin (Server.Retention less Server.RetentionMargin: 23 hours
// by default), counted from the tap, or from this hand-out for an intent
// stored not sent. Do not keep it longer: a request sent after the server
// forgot its key is done anew. Ask HTTPRequest again instead. It refuses
// an intent too old to send; an unresolved one is then stored expired
// (the error matches ErrOutcomeUnknown), to settle with Settle or
// Reconcile.
//
// An error after the intent was armed (a store's read or write failed)
// comes with no request and matches ErrOutcomeUnknown: nothing was handed
// out, but the intent is armed, and a later Do or SettleAll may send it.
func (c *Client) HTTPRequest(ctx context.Context, in *Intent) (*http.Request, error) {
	if in == nil {
		return nil, errors.New("idem: HTTPRequest with a nil intent")
	}
	// The request leaves the Client's hands: the intent is armed, and
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

// ErrNoIdentity: a POST or PATCH sent through the Client's RoundTripper
// states no intent. The RoundTripper never guesses one, and never makes a
// fresh key for such a request: an API client that sends it again (after a
// lost answer, through a transport that clones it) would pay twice. Name
// the request's action with ContextWithAction, pass its intent with
// ContextWithIntent, or set its own Idempotency-Key. Nothing was sent.
var ErrNoIdentity = errors.New("idem: a POST or PATCH through the RoundTripper states no intent: name its action (ContextWithAction), pass its intent (ContextWithIntent) or set its Idempotency-Key")

// ErrRequestTooLarge: a request's body through the RoundTripper is over
// MaxRequestBodyBytes. Nothing was sent.
var ErrRequestTooLarge = errors.New("idem: the request's body is over MaxRequestBodyBytes")

// MaxRequestBodyBytes is the largest body the RoundTripper sends. Every
// attempt sends the same bytes, so it holds them (and an action's intent
// stores them on the device): a larger body is refused with
// ErrRequestTooLarge before anything is sent, and never read whole. One
// whose ContentLength says so is not read at all; a stream is read to one
// byte past the limit.
const MaxRequestBodyBytes = 10 << 20

type actionKey struct{}

// ContextWithAction returns a context that names the action, as
// Client.Intent takes it, of a POST or PATCH sent with it through the
// Client's RoundTripper. The RoundTripper takes the action's intent for
// the request as Intent does, and arms it as Do does: the same request,
// sent again, cloned (req.Clone keeps the context) or copied, is the same
// intent with the same key, and its retries survive restarts. A changed
// request follows Intent's rules: it replaces an intent never sent, and is
// refused (*UnresolvedError, *ResolvedError) while the action's latest
// intent may have been sent or was paid. The intent stores the request's
// method, URL, body and its Content-Type, Content-Encoding,
// Content-Language and Accept fields; the other fields (credentials
// among them) go on the wire only.
func ContextWithAction(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, actionKey{}, name)
}

// actionFromContext returns the action named by ctx, if any.
func actionFromContext(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(actionKey{}).(string)
	return name, ok && name != ""
}

// storedRequestFields are the header fields an action's intent made by the
// RoundTripper keeps: what the server needs to read the body again after a
// restart. Anything else may be a credential, which the device never
// stores.
var storedRequestFields = []string{"Content-Type", "Content-Encoding", "Content-Language", "Accept"}

// RoundTripper returns an http.RoundTripper that sends POST and PATCH
// requests with an Idempotency-Key and retries them under the Client's
// policy, so any *http.Client (a generated API client, say) gets safe
// retries:
//
//	hc := &http.Client{Transport: client.RoundTripper(http.DefaultTransport)}
//	ctx := idem.ContextWithAction(ctx, "checkout-"+cartID)
//
// A request's identity is what the app states, never which object it is,
// so a clone (an auth transport's req.Clone) and a request sent again (an
// API client's own retry) keep it. In this order:
//
//   - an intent in the request's context (ContextWithIntent): the request
//     must be the intent's, else the round trip fails with
//     ErrIntentMismatch before anything is sent;
//   - the request's own Idempotency-Key: a stored intent's key makes the
//     request that intent (and it must be its request); another key (an
//     API client that chose it, as Stripe's do) is sent on every attempt,
//     and kept in memory for this call only;
//   - an action named in the request's context (ContextWithAction): the
//     action's intent for this request, stored and armed as by Do.
//
// A POST or PATCH that states none is refused with ErrNoIdentity, and one
// whose body is over MaxRequestBodyBytes with ErrRequestTooLarge; nothing
// is sent. The live request's header fields (credentials set by the
// caller's transports included) go on the wire, with the intent's key.
//
// A final answer, 4xx included, is returned as the response (one larger
// than Server.MaxResponseBytes with an empty body and only its stored
// header fields, as Response.Oversized describes). A 301, 302 or 303 is
// returned too, to the app's http.Client, whose following GET carries no
// key and no intent. A 303 that the server marked is the intent's
// success, and its GET is sent. Any other (a 301, a 302, an unmarked 303:
// a captive portal's, say) leaves the outcome unknown, and the intent is
// settled later (Settle, Reconcile): its GET is not sent, and ends with
// the call's error, which wraps *RetryError, so that no login page
// reaches the app as its payment's answer. A client whose CheckRedirect
// returns http.ErrUseLastResponse gets that 3xx itself. The GET is known
// by the 3xx's Body: a transport over the RoundTripper that replaces the
// Body hides it, and then the GET passes through, and its answer is not
// the payment's. Any other unknown outcome
// is returned as an error wrapping *RetryError. Other methods pass through
// to base untouched and never carry a key (one set by the app on a
// redirect's GET is taken off). base nil means http.DefaultTransport. The
// RoundTripper is safe for concurrent use.
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

	// callers holds the in-memory intent of each caller's own key (one
	// that names no stored intent) until it resolves: the caller's retry
	// of the same request, however much later, is the same intent, whose
	// age counts from its first send, so that it is not sent past the
	// server's retention. A restart forgets them.
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

	// The live request's headers go on the wire (credentials set by the
	// caller's client included), minus the key, which is the intent's.
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
			// A 301, 302 or unmarked 303 is the app's client's to follow:
			// the intent's outcome stays unknown, and its GET carries no
			// key.
			resp := httpResponse(req, last)
			resp.Body = &handedBackBody{Reader: bytes.NewReader(last.Body), err: err}
			return resp, nil
		}
		return nil, err
	}
	// A response is a final answer: an *APIError only interprets it, and a
	// *SaveError leaves the intent unresolved on the device, where the next
	// Do replays the server's stored answer. Either way the answer is
	// returned, as a RoundTripper must.
	return httpResponse(req, resp), nil
}

// refuse returns why req cannot be sent, before its body is read: it
// states no identity (ErrNoIdentity), its body is known to be over
// MaxRequestBodyBytes, or its context carries a bad RetryPolicy.
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

// intentFor returns the intent that req, whose bytes are live, states:
// see RoundTripper. A stored intent is armed.
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
		// it: the same request is the same intent, whatever object
		// carries it.
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
	// The caller's own key, which names no stored intent (an API client
	// that retries with it after an error): every attempt carries it.
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
	in = &Intent{rec: rec, ephemeral: true, callersKey: true, keys: t.c.keys}
	if t.callers[k] == nil {
		// The first request under the key is the one whose age counts;
		// another request under it is refused by the server (key reused).
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
// http.Client is to follow it: a 301, 302 or 303 (one the server did not
// mark) after which the client's GET fetches what it names. A 307 or 308
// that reached the client was not followed on purpose (from https to
// http), and other 3xx name nothing to fetch: those stay errors.
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

// followsUnknown returns why req, the GET an http.Client makes to follow
// a redirect this RoundTripper handed back, is not sent: the redirect
// left the payment's outcome unknown, and the page it names (a captive
// portal's login page, say) would reach the app as the answer to its
// payment, with no error. The app's client still sees the redirect
// itself (CheckRedirect, http.ErrUseLastResponse).
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
// HEAD) an http.Client makes to follow a redirect: it copies the
// request's header fields, the app's own key among them, and a GET never
// carries a key.
func keyless(req *http.Request) *http.Request {
	if req.Response == nil || req.Header.Get("Idempotency-Key") == "" {
		return req
	}
	out := req.Clone(req.Context())
	out.Header.Del("Idempotency-Key")
	return out
}

// readRequestBody returns req's body, refusing one over
// MaxRequestBodyBytes after reading one byte past it at most.
func readRequestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	src := req.Body
	if req.GetBody != nil {
		// A fresh copy: a request sent again has its bytes even when the
		// caller did not rewind its Body.
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

// readAtMost reads r to its end, as io.ReadAll does, and fails with
// ErrRequestTooLarge past limit bytes. size, the length r says it has
// (ContentLength; 0 or less when unknown), sizes the buffer, so that a
// body of the length it states is read into one allocation.
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
			// passed: at most about twice the limit is allocated in all.
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
