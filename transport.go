package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"weak"

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
	spelling := rec.KeyHeader
	if spelling == "" {
		// Stored before spellings were: Do sends it as this Client spells.
		spelling = c.keyHeader(rec.Key)
	}
	req.Header.Set("Idempotency-Key", spelling)
	return req, nil
}

// RoundTripper returns an http.RoundTripper that gives POST and PATCH
// requests an Idempotency-Key and retries them under the Client's policy,
// so any *http.Client (a generated API client, say) gets safe retries:
//
//	hc := &http.Client{Transport: client.RoundTripper(http.DefaultTransport)}
//
// The key comes from the intent in the request's context (see
// ContextWithIntent); the request must then be the intent's request, else
// the round trip fails with ErrIntentMismatch before anything is sent.
// Without one, the RoundTripper makes a key for that request and keeps it
// in memory only: its retries are safe, and so is sending the same
// *http.Request again (an API client's own retry loop), which gets the same
// key while it holds the same bytes (a body without GetBody, spent by the
// first round trip, is sent again from the intent's bytes); the request is
// neither changed nor kept alive by it. The same request is known by its
// *url.URL, which net/http's shallow copies of it share (an http.Client
// with a Timeout makes one on every Do): a new request that shares another's
// *url.URL and holds the same bytes (method, URL and body), or the same
// spent streamed Body, is taken for that request and gets its key; one
// that differs in any of them is a new request. A clone, or a new request
// with its own URL (http.NewRequest parses one), gets a new key. A restart
// forgets them all. Use
// intents for anything that must survive a restart. A request that carries
// its own Idempotency-Key keeps it: if the key is a stored intent's, the
// request is that intent (and must be its request); otherwise (an API
// client that retries with its own key) the caller's retries are safe too.
//
// Other methods pass through to base untouched and never carry a key. A
// final answer, 4xx included, is returned as the response (one larger than
// Server.MaxResponseBytes with an empty body and only its stored header
// fields, as Response.Oversized describes); an unknown
// outcome is returned as an error wrapping *RetryError. base nil means
// http.DefaultTransport. The RoundTripper is safe for concurrent use.
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

	// sent holds the in-memory intent of each live request that this
	// RoundTripper gave a key, by a weak pointer to the request's *url.URL:
	// the same *http.Request sent again (an API client's own retry) is the
	// same intent, and a request the caller dropped is forgotten with it.
	// The URL, not the request, names it because an http.Client with a
	// Timeout (or any deadline, or credentials in the URL) hands the
	// RoundTripper a shallow copy of the caller's request on every Do: the
	// copy shares the caller's *url.URL (and Body), while a Clone copies
	// both.
	mu   sync.Mutex
	sent map[weak.Pointer[url.URL]]sentRequest
}

// sentRequest is what the RoundTripper keeps of a request it gave a key.
type sentRequest struct {
	in   *Intent
	body io.ReadCloser // the request's Body when it was sent
}

// intentOf returns the in-memory intent this RoundTripper made for req, if
// req (or net/http's shallow copy of it) was sent through it before with
// the same bytes, or with the same streamed body that the earlier round
// trip spent. Requests that share a *url.URL but differ in their bytes or
// their streamed body are different requests.
func (t *roundTripper) intentOf(req *http.Request, live Request) *Intent {
	t.mu.Lock()
	s, ok := t.sent[weak.Make(req.URL)]
	t.mu.Unlock()
	if !ok {
		return nil
	}
	in := s.in
	if in.matches(live) {
		return in
	}
	// A body without GetBody was read to its end by the earlier round
	// trip: sent again, it reads empty. It is the same request, whose
	// bytes the intent holds; never an empty POST with a new key.
	rec := in.current()
	if req.GetBody == nil && len(live.Body) == 0 && len(rec.Body) > 0 && live.Method == rec.Method && live.URL == rec.URL && sameBody(s.body, req.Body) {
		return in
	}
	return nil
}

// sameBody reports whether a and b are the same Body value, without
// panicking on a Body of a type that == cannot compare.
func sameBody(a, b io.ReadCloser) bool {
	if a == nil || b == nil {
		return false
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Type() != vb.Type() || !va.Comparable() {
		return false
	}
	return va.Equal(vb)
}

// remember makes in the intent of req until req's URL is collected.
func (t *roundTripper) remember(req *http.Request, in *Intent) {
	wp := weak.Make(req.URL)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sent == nil {
		t.sent = make(map[weak.Pointer[url.URL]]sentRequest)
	}
	if _, ok := t.sent[wp]; !ok {
		runtime.AddCleanup(req.URL, t.forget, wp)
	}
	t.sent[wp] = sentRequest{in: in, body: req.Body}
}

func (t *roundTripper) forget(wp weak.Pointer[url.URL]) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sent, wp)
}

func (t *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost && req.Method != http.MethodPatch {
		return t.base.RoundTrip(req)
	}
	body, err := readRequestBody(req)
	if err != nil {
		return nil, err
	}
	if err := checkPolicy(req.Context()); err != nil {
		return nil, err
	}
	live := Request{Method: req.Method, URL: req.URL.String(), Header: req.Header, Body: body}

	ctx := req.Context()
	in, ok := intentFromContext(ctx)
	if k := req.Header.Get("Idempotency-Key"); !ok && k != "" {
		// A request that carries a stored intent's key is that intent.
		switch stored, err := t.c.Load(ctx, k); {
		case err == nil:
			in, ok = stored, true
		case !errors.Is(err, persist.ErrNotFound):
			return nil, err
		}
	}
	if ok {
		if !in.matches(live) {
			return nil, fmt.Errorf("%w: intent %s, request %s %s", ErrIntentMismatch, in.Key(), req.Method, req.URL.Redacted())
		}
		if err := t.c.arm(ctx, in); err != nil {
			return nil, err
		}
	} else if again := t.intentOf(req, live); again != nil {
		// The same request object, sent again: the same intent.
		in = again
	} else {
		if err := live.validate(); err != nil {
			return nil, err
		}
		rec, err := t.c.newRecord("", live, live.fingerprint(), 1, t.c.clock.Now())
		if err != nil {
			return nil, err
		}
		if k := req.Header.Get("Idempotency-Key"); k != "" {
			// The caller's own key, which names no stored intent (an API
			// client that retries with it after an error): a fresh one per
			// call would make each of its retries a new payment.
			rec.Key, rec.KeyHeader = k, k
		}
		in = &Intent{rec: rec, ephemeral: true, callersKey: req.Header.Get("Idempotency-Key") != "", keys: t.c.keys}
		t.remember(req, in)
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
	if resp == nil {
		return nil, err
	}
	// A response is a final answer: an *APIError only interprets it, and a
	// *SaveError leaves the intent unresolved on the device, where the next
	// Do replays the server's stored answer. Either way the answer is
	// returned, as a RoundTripper must.
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
	}, nil
}

func readRequestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	if req.GetBody != nil {
		// A fresh copy: a request sent again has its bytes even when the
		// caller did not rewind its Body.
		if b, err := req.GetBody(); err == nil {
			defer b.Close()
			out, err := io.ReadAll(b)
			if err != nil {
				return nil, fmt.Errorf("idem: reading request body: %w", err)
			}
			return out, nil
		}
	}
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, fmt.Errorf("idem: reading request body: %w", err)
	}
	return b, nil
}
