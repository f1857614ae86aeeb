// Package idemotel traces idem with OpenTelemetry: a span per intent's
// call, an event per attempt, and the http.resend_count attribute, all
// from idem's attempt hook (idem.Config.OnAttempt). It lives in a module
// of its own, so that idem's module does not depend on OpenTelemetry.
//
//	tr := idemotel.New(otel.GetTracerProvider())
//	client, err := idem.New(idem.Config{Store: store, Server: idem.Server{Mark: idem.MarkEcho}, OnAttempt: tr.Hook})
//	...
//	resp, err := tr.Send(ctx, client, "checkout:cart-42", req)
//
// Send opens the intent's span as a child of ctx's span and ends it with
// the outcome (idem.outcome: succeeded, final answer, unknown or
// error). Calls made without it (SettleAll at app start, Do, the
// RoundTripper) get a span of their own, opened by their first attempt's
// event and ended by their last.
package idemotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// The names of the spans, events and attributes it makes.
const (
	SpanName  = "idem.intent"
	EventName = "idem.attempt"

	// ResendCount is the number of attempts after the first, as
	// OpenTelemetry's HTTP conventions name it (http.resend_count; the
	// newer conventions spell it http.request.resend_count, which is set
	// too).
	ResendCount        = attribute.Key("http.resend_count")
	RequestResendCount = attribute.Key("http.request.resend_count")

	Action   = attribute.Key("idem.action")
	Key      = attribute.Key("idem.key")
	Attempts = attribute.Key("idem.attempts")
	Outcome  = attribute.Key("idem.outcome")
	Attempt  = attribute.Key("idem.attempt")
	Retry    = attribute.Key("idem.retry")
	WaitMS   = attribute.Key("idem.wait_ms")
	TookMS   = attribute.Key("idem.duration_ms")
	Status   = attribute.Key("http.response.status_code")
	URL      = attribute.Key("url.full")
	ErrorMsg = attribute.Key("error.message")
)

// Tracer makes the spans. It is safe for concurrent use: SettleAll calls
// the hook from several goroutines at once.
type Tracer struct {
	tracer trace.Tracer

	mu sync.Mutex
	// byAction holds the span of each Send under way, by action name:
	// one Send may make a second intent (after a void one), under the
	// same name.
	byAction map[string]*span
	// byKey holds the spans the hook opened for calls made without Send.
	byKey map[string]*span
}

type span struct {
	trace.Span
	attempts int
	key      string // the last attempt's
}

// outcome names what became of a Send: a success, a final answer that is
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

// New returns a Tracer that makes its spans with tp.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{
		tracer:   tp.Tracer("github.com/idemkit/idem/examples/otel"),
		byAction: make(map[string]*span),
		byKey:    make(map[string]*span),
	}
}

// Send is client.Send inside a span for the action name: one event per
// attempt, and at the end the number of resends, the intent's key and
// the outcome, and an error status when no success came of it. A second Send for
// a name while one runs (idem makes it wait for the first, or refuses it)
// gets a span of its own without events.
func (t *Tracer) Send(ctx context.Context, client *idem.Client, name string, req idem.Request) (*idem.Response, error) {
	ctx, s := t.tracer.Start(ctx, SpanName, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(Action.String(name), URL.String(req.URL)))
	sp := &span{Span: s}
	t.mu.Lock()
	_, busy := t.byAction[name]
	if !busy {
		t.byAction[name] = sp
	}
	t.mu.Unlock()
	defer func() {
		if !busy {
			t.mu.Lock()
			delete(t.byAction, name)
			t.mu.Unlock()
		}
	}()

	resp, err := client.Send(ctx, name, req)
	t.mu.Lock()
	key := sp.key
	t.mu.Unlock()
	if key != "" {
		s.SetAttributes(Key.String(key))
	}
	s.SetAttributes(Outcome.String(outcome(err)))
	t.end(sp, err)
	return resp, err
}

// Hook is the attempt hook: set it as idem.Config.OnAttempt.
func (t *Tracer) Hook(a idem.Attempt) {
	t.mu.Lock()
	sp, sent := t.byAction[a.Name]
	own := false
	if !sent || a.Name == "" {
		if sp = t.byKey[a.Key]; sp == nil {
			// A call made without Send: its span begins with its first
			// attempt, whose duration the hook knows.
			_, s := t.tracer.Start(context.Background(), SpanName,
				trace.WithSpanKind(trace.SpanKindClient),
				trace.WithTimestamp(time.Now().Add(-a.Duration)),
				trace.WithAttributes(Action.String(a.Name), Key.String(a.Key), URL.String(a.URL)))
			sp = &span{Span: s}
			t.byKey[a.Key] = sp
		}
		own = true
	}
	sp.attempts++
	sp.key = a.Key
	if own && !a.Retry {
		delete(t.byKey, a.Key)
	}
	t.mu.Unlock()

	attrs := []attribute.KeyValue{
		Attempt.Int(a.Number),
		Key.String(a.Key),
		Retry.Bool(a.Retry),
		TookMS.Int64(a.Duration.Milliseconds()),
	}
	if a.StatusCode != 0 {
		attrs = append(attrs, Status.Int(a.StatusCode))
	}
	if a.Retry {
		attrs = append(attrs, WaitMS.Int64(a.Wait.Milliseconds()))
	}
	if a.Err != nil {
		attrs = append(attrs, ErrorMsg.String(a.Err.Error()))
	}
	sp.AddEvent(EventName, trace.WithAttributes(attrs...))
	if own && !a.Retry {
		// The call's last attempt: a final answer or the end of its
		// budget (a 2xx, or anything else).
		var err error
		if a.Err != nil || a.StatusCode < 200 || a.StatusCode > 299 {
			err = errors.New("no success")
		}
		t.end(sp, err)
	}
}

// end ends a span with its resend count and status.
func (t *Tracer) end(sp *span, err error) {
	t.mu.Lock()
	n := sp.attempts
	t.mu.Unlock()
	resends := max(0, n-1)
	sp.SetAttributes(Attempts.Int(n), ResendCount.Int(resends), RequestResendCount.Int(resends))
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
