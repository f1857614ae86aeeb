// Package idemotel traces idem with OpenTelemetry, by the HTTP semantic
// conventions: a CLIENT span per request on the wire, made by otelhttp's
// Transport, under an INTERNAL span per intent's call. A resend carries
// http.request.resend_count, so a trace shows each retry as the request
// it is, under the payment it belongs to. It lives in a module of its
// own, so that idem's module does not depend on OpenTelemetry.
//
//	tr := idemotel.New(otel.GetTracerProvider())
//	client, err := idem.New(idem.Config{
//		HTTPClient: &http.Client{Transport: tr.Transport(nil), Timeout: 30 * time.Second},
//		Server:     idem.Server{Mark: idem.MarkEcho},
//		OnAttempt:  tr.Hook,
//		...
//	})
//	resp, err := tr.Send(ctx, client, "checkout:cart-42", req)
//	settled, err := tr.SettleAll(ctx, client)
//
// Send and SettleAll open the spans of the intents they call for under
// ctx's span, and end them with the outcome. A call made without them
// (client.Do, client.SettleAll, the RoundTripper) gets its intent's span
// from the Transport at its first request, under the span of the call's
// context; the hook ends it with the call's last attempt, or when that
// context ends. The hook finds the caller's span and values in
// Attempt.Context.
//
// No span holds a credential: url.full has no user info and no value of
// a query parameter named for a credential (see RedactURL), and an
// error's text is never recorded, only its type (error.type).
package idemotel

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/idemkit/idem"
)

// ScopeName is the instrumentation scope of the intents' spans.
const ScopeName = "github.com/idemkit/idem/examples/otel"

// The names of the intent's spans, and the attributes of idem's own that
// they carry beside the conventions' (http.request.method, url.full,
// http.response.status_code, error.type): the conventions name no action,
// idempotency key or outcome.
const (
	IntentSpan    = "idem.intent"
	SettleAllSpan = "idem.settle_all"

	Action  = attribute.Key("idem.action")
	Key     = attribute.Key("idem.key")
	Outcome = attribute.Key("idem.outcome")
)

// KeyHeader is the header field that carries an intent's key: the
// Transport opens the span of a call made without Send by it.
const KeyHeader = "Idempotency-Key"

// Tracer makes the spans. It is safe for concurrent use: SettleAll calls
// the hook and the Transport from several goroutines at once.
type Tracer struct {
	tp     trace.TracerProvider
	tracer trace.Tracer

	mu sync.Mutex
	// open holds, by key, the spans that the Transport or the hook
	// opened for calls made without Send.
	open map[string]*intent
}

// intent is the span of one intent's call, and the requests it made.
type intent struct {
	span     trace.Span
	own      bool // opened for a call made without Send: the hook ends it
	mu       sync.Mutex
	requests int
	key      string
	status   int         // the last answer's status, 0 for none
	stop     func() bool // ends the watch on the call's context
	ended    bool
	// settling: opened under SettleAll, which ends it with the intent's
	// outcome, at the time of its last attempt (lastAt).
	settling bool
	lastAt   time.Time
}

type (
	intentKey  struct{}
	resendKey  struct{}
	urlKey     struct{}
	settlesKey struct{}
)

// New returns a Tracer that makes its spans with tp.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tp: tp, tracer: tp.Tracer(ScopeName), open: make(map[string]*intent)}
}

// Transport returns the RoundTripper for idem's http.Client: otelhttp's
// Transport on base (http.DefaultTransport if nil), which makes a CLIENT
// span per request, under the span of the request's intent. Its spans
// carry a redacted url.full, and a resend carries
// http.request.resend_count.
func (t *Tracer) Transport(base http.RoundTripper) http.RoundTripper {
	inner := otelhttp.NewTransport(base, otelhttp.WithTracerProvider(redactingProvider{tp: t.tp}))
	return &transport{t: t, next: inner}
}

type transport struct {
	t    *Tracer
	next http.RoundTripper
}

// RoundTrip counts the request under its intent's span, opening that span
// for a call made without Send, and hands it to otelhttp with the span as
// its parent, and its redacted URL and resend count in the context.
func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	in, _ := ctx.Value(intentKey{}).(*intent)
	if in == nil {
		in = tr.t.opened(ctx, req.Header.Get(KeyHeader), req.Method, req.URL.String(), "")
	}
	in.mu.Lock()
	resends := in.requests
	in.requests++
	in.mu.Unlock()
	ctx = context.WithValue(trace.ContextWithSpan(ctx, in.span), urlKey{}, RedactURL(req.URL.String()))
	if resends > 0 {
		ctx = context.WithValue(ctx, resendKey{}, resends)
	}
	return tr.next.RoundTrip(req.WithContext(ctx))
}

// opened returns the span of the call for key made without Send, opening
// it under ctx's span if it is not open.
func (t *Tracer) opened(ctx context.Context, key, method, rawURL, name string) *intent {
	t.mu.Lock()
	defer t.mu.Unlock()
	if in := t.open[key]; in != nil && key != "" {
		return in
	}
	attrs := []attribute.KeyValue{semconv.URLFull(RedactURL(rawURL))}
	if method != "" {
		attrs = append(attrs, semconv.HTTPRequestMethodKey.String(method))
	}
	if key != "" {
		attrs = append(attrs, Key.String(key))
	}
	if name != "" {
		attrs = append(attrs, Action.String(name))
	}
	_, s := t.tracer.Start(ctx, IntentSpan, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	in := &intent{span: s, own: true, key: key, settling: ctx.Value(settlesKey{}) != nil}
	if key != "" {
		t.open[key] = in
	}
	return in
}

// Send is client.Send inside the span of the intent: its requests' CLIENT
// spans are its children, and it ends with the outcome.
func (t *Tracer) Send(ctx context.Context, client *idem.Client, name string, req idem.Request) (*idem.Response, error) {
	ctx, s := t.tracer.Start(ctx, IntentSpan, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(Action.String(name), semconv.HTTPRequestMethodKey.String(req.Method), semconv.URLFull(RedactURL(req.URL))))
	in := &intent{span: s}
	resp, err := client.Send(context.WithValue(ctx, intentKey{}, in), name, req)
	in.end(err, true)
	return resp, err
}

// SettleAll is client.SettleAll inside a span of its own: each intent's
// span is its child, and ends with the intent's outcome.
func (t *Tracer) SettleAll(ctx context.Context, client *idem.Client) ([]idem.Settled, error) {
	ctx, s := t.tracer.Start(ctx, SettleAllSpan, trace.WithSpanKind(trace.SpanKindInternal))
	defer s.End()
	settled, err := client.SettleAll(context.WithValue(ctx, settlesKey{}, true))
	for _, st := range settled {
		t.mu.Lock()
		in := t.open[st.Intent.Key()]
		delete(t.open, st.Intent.Key())
		t.mu.Unlock()
		if in != nil {
			in.end(st.Err, true)
		}
	}
	if err != nil {
		s.SetStatus(codes.Error, "listing the intents failed")
		s.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
	}
	return settled, err
}

// Hook is the attempt hook: set it as idem.Config.OnAttempt. It records
// each attempt's key and answer on its intent's span, and ends the span
// of a call made without Send or SettleAll with the call's last attempt,
// or when the call's context (Attempt.Context) ends first. Such a span
// has no idem.outcome, which only the call's caller learns (an unmarked
// 200 is no success): its status is an error when the last attempt got
// an error or a status of 400 or more, as a CLIENT span's is.
func (t *Tracer) Hook(a idem.Attempt) {
	in, _ := a.Context.Value(intentKey{}).(*intent)
	if in == nil {
		// A call made without Send. An attempt that never reached the
		// Transport (the Authorizer failed) opens its span here.
		in = t.opened(a.Context, a.Key, "", a.URL, a.Name)
	}
	in.mu.Lock()
	if in.key != a.Key {
		// Send may make a second intent after a void one: the span
		// names the last.
		in.key = a.Key
		in.span.SetAttributes(Key.String(a.Key))
	}
	in.status = a.StatusCode
	in.lastAt = time.Now()
	if in.own && !in.settling && in.stop == nil && a.Retry {
		// The call may end in the wait, where the hook hears nothing
		// more: its context's end ends the span.
		ctx := a.Context
		in.stop = context.AfterFunc(ctx, func() { t.close(a.Key, in, ctx.Err()) })
	}
	in.mu.Unlock()
	if in.own && !in.settling && !a.Retry {
		var err error
		if a.Err != nil {
			err = a.Err
		} else if a.StatusCode >= 400 {
			err = statusError(a.StatusCode)
		}
		t.close(a.Key, in, err)
	}
}

// statusError is a last answer's status of 400 or more, for error.type.
type statusError int

func (e statusError) Error() string { return "status " + strconv.Itoa(int(e)) }

// close ends the span of a call made without Send.
func (t *Tracer) close(key string, in *intent, err error) {
	t.mu.Lock()
	if t.open[key] == in {
		delete(t.open, key)
	}
	t.mu.Unlock()
	in.end(err, false)
}

// end ends the span once, with err, and with its outcome when the caller
// of the call knows it (known).
func (in *intent) end(err error, known bool) {
	in.mu.Lock()
	if in.ended {
		in.mu.Unlock()
		return
	}
	in.ended = true
	stop, status, key, lastAt := in.stop, in.status, in.key, in.lastAt
	in.mu.Unlock()
	if stop != nil {
		stop()
	}
	if key != "" {
		in.span.SetAttributes(Key.String(key))
	}
	if status != 0 {
		in.span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	description := ""
	if known {
		description = outcome(err)
		in.span.SetAttributes(Outcome.String(description))
	}
	if err != nil {
		in.span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		in.span.SetStatus(codes.Error, description)
	}
	var opts []trace.SpanEndOption
	if in.settling && !lastAt.IsZero() {
		// SettleAll ends it when all are done: it ended at its last
		// attempt.
		opts = append(opts, trace.WithTimestamp(lastAt))
	}
	in.span.End(opts...)
}

// outcome names what became of a call: a success, a final answer that is
// not one (a declined card), an unknown outcome (settle it later), or an
// error before anything was sent.
func outcome(err error) string {
	var apiErr *idem.APIError
	switch {
	case err == nil:
		return "succeeded"
	case errors.As(err, &apiErr):
		return "final answer"
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return "unknown"
	}
	return "error"
}

// errorType is error.type by the conventions: a low-cardinality name of
// the error class, never its text (which may name a URL). A final answer
// is named by its status code, as otelhttp names an HTTP error.
func errorType(err error) string {
	var (
		apiErr *idem.APIError
		status statusError
	)
	switch {
	case errors.As(err, &apiErr):
		return strconv.Itoa(apiErr.StatusCode)
	case errors.As(err, &status):
		return strconv.Itoa(int(status))
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return "idem.outcome_unknown"
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	}
	return fmt.Sprintf("%T", err)
}

// RedactURL returns raw as url.full may carry it, by the conventions:
// the user info replaced by REDACTED:REDACTED, and the value of each query
// parameter named for a credential replaced by REDACTED. A name is one
// when it holds, in lower case and without '-', '_' and '.', a word of
// credentialWords (idem's own redaction of Attempt.URL speaks of the same
// words): access_token, api_key, X-Amz-Signature, sig, AWSAccessKeyId,
// X-Goog-Signature. The fragment, which no server sees, is dropped. An
// unparsable raw is replaced whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "REDACTED"
	}
	if u.User != nil {
		u.User = url.UserPassword("REDACTED", "REDACTED")
	}
	u.Fragment, u.RawFragment = "", ""
	if u.RawQuery != "" {
		parts := strings.Split(u.RawQuery, "&")
		for i, part := range parts {
			name, _, _ := strings.Cut(part, "=")
			if n, err := url.QueryUnescape(name); err != nil || credential(n) {
				parts[i] = name + "=REDACTED"
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	return u.String()
}

// credentialWords are the words that make a query parameter's name one
// of a credential: those of idem's redaction, with the conventions' sig
// and the key of an access key.
var credentialWords = []string{"key", "sig", "token", "secret", "password", "passwd", "auth", "session",
	"credential", "cookie", "csrf", "xsrf", "jwt", "oidc", "saml", "assertion", "bearer", "code"}

func credential(name string) bool {
	n := strings.NewReplacer("-", "", "_", "", ".", "").Replace(strings.ToLower(name))
	for _, w := range credentialWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// redactingProvider gives otelhttp tracers whose spans carry url.full
// redacted (RedactURL), at their start and when set later (otelhttp sets
// it after the start), and, for a resend, http.request.resend_count from
// the start. otelhttp itself strips only the user info; the Transport
// puts the URL it redacted, user info included, in the context.
type redactingProvider struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (p redactingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return redactingTracer{Tracer: p.tp.Tracer(name, opts...)}
}

type redactingTracer struct{ trace.Tracer }

func (t redactingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	full, _ := ctx.Value(urlKey{}).(string)
	attrs := redacted(cfg.Attributes(), full)
	if n, ok := ctx.Value(resendKey{}).(int); ok {
		attrs = append(attrs, semconv.HTTPRequestResendCount(n))
	}
	out := []trace.SpanStartOption{trace.WithSpanKind(cfg.SpanKind()), trace.WithAttributes(attrs...), trace.WithLinks(cfg.Links()...)}
	if !cfg.Timestamp().IsZero() {
		out = append(out, trace.WithTimestamp(cfg.Timestamp()))
	}
	if cfg.NewRoot() {
		out = append(out, trace.WithNewRoot())
	}
	ctx, s := t.Tracer.Start(ctx, name, out...)
	return ctx, redactingSpan{Span: s, full: full}
}

// redactingSpan is a span whose url.full is redacted as it is set.
type redactingSpan struct {
	trace.Span
	full string // the request's URL redacted, "" if unknown
}

func (s redactingSpan) SetAttributes(kvs ...attribute.KeyValue) {
	s.Span.SetAttributes(redacted(kvs, s.full)...)
}

// redacted returns kvs with url.full redacted, or replaced by full if set.
func redacted(kvs []attribute.KeyValue, full string) []attribute.KeyValue {
	out := make([]attribute.KeyValue, len(kvs), len(kvs)+1)
	for i, kv := range kvs {
		if kv.Key == semconv.URLFullKey {
			kv = semconv.URLFull(cmp.Or(full, RedactURL(kv.Value.AsString())))
		}
		out[i] = kv
	}
	return out
}
