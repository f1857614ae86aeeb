package idemotel_test

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	idemotel "github.com/idemkit/idem/examples/otel"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// env is a fake payments server, a Client that traces through tr, and the
// in-memory exporter that gets the spans it ends, each as it ends.
type env struct {
	srv    *fakeserver.Server
	client *idem.Client
	tr     *idemotel.Tracer
	tp     *sdktrace.TracerProvider
	exp    *tracetest.InMemoryExporter
	// intentEnded receives the name of each intent span as it ends.
	intentEnded chan struct{}
}

// endSignal tells of each intent span's end: a span that a context's end
// ends is ended on a goroutine of its own.
type endSignal struct {
	sdktrace.SpanProcessor
	ch chan struct{}
}

func (p endSignal) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.Name() == idemotel.IntentSpan {
		p.ch <- struct{}{}
	}
}

// setup makes an env. hook, if set, runs after the Tracer's hook.
func setup(t *testing.T, hook func(idem.Attempt)) *env {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	exp := tracetest.NewInMemoryExporter()
	ended := make(chan struct{}, 100)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSpanProcessor(endSignal{SpanProcessor: tracetest.NewSpanRecorder(), ch: ended}))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := idemotel.New(tp)
	client, err := idem.New(idem.Config{
		HTTPClient:  &http.Client{Transport: tr.Transport(srv.Client().Transport)},
		Store:       persist.NewMemory(nil),
		Clock:       clk,
		RetryPolicy: idem.RetryPolicy{Jitter: -1},
		Server:      idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
		OnAttempt: func(a idem.Attempt) {
			tr.Hook(a)
			if hook != nil {
				hook(a)
			}
		},
	})
	require.NoError(t, err)
	return &env{srv: srv, client: client, tr: tr, tp: tp, exp: exp, intentEnded: ended}
}

func (e *env) payment(t *testing.T, url string, amount int) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, url, map[string]any{
		"amount": amount, "currency": "EUR", "customer": "cus_1",
	})
	require.NoError(t, err)
	return req
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// spans returns the ended spans named name (any name if ""), of kind,
// in the order they started.
func spans(e *env, name string, kind trace.SpanKind) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.exp.GetSpans().Snapshots() {
		if (name == "" || s.Name() == name) && s.SpanKind() == kind {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartTime().Before(out[j].StartTime()) })
	return out
}

// requireChildren checks that each span of children is a child of parent,
// in its trace.
func requireChildren(t *testing.T, parent trace.SpanContext, children ...sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, c := range children {
		require.Equal(t, parent.TraceID(), c.SpanContext().TraceID(), "%s: in the parent's trace", c.Name())
		require.Equal(t, parent.SpanID(), c.Parent().SpanID(), "%s: a child of the parent", c.Name())
	}
}

// resends returns the http.request.resend_count of each span, -1 where it
// is absent.
func resends(ss []sdktrace.ReadOnlySpan) []int64 {
	out := make([]int64, len(ss))
	for i, s := range ss {
		out[i] = -1
		if v, ok := attrs(s.Attributes())[semconv.HTTPRequestResendCountKey]; ok {
			out[i] = v.AsInt64()
		}
	}
	return out
}

// TestSpans checks the spans of a call: one for the intent, one per
// request, none holding a credential.
func TestSpans(t *testing.T) {
	// A Send whose first answer is lost: an INTERNAL span for the intent, a
	// child of the caller's, over a CLIENT span per request; the resend
	// carries http.request.resend_count.
	t.Run("a Send is an intent span over a client span per request", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))

		ctx, parent := e.tp.Tracer("app").Start(context.Background(), "checkout")
		resp, err := e.tr.Send(ctx, e.client, "checkout:cart-42", e.payment(t, e.srv.URL+"/payments", 1500))
		parent.End()
		require.NoError(t, err)
		require.True(t, resp.Replayed)

		intents := spans(e, idemotel.IntentSpan, trace.SpanKindInternal)
		require.Len(t, intents, 1)
		in := intents[0]
		requireChildren(t, parent.SpanContext(), in)
		a := attrs(in.Attributes())
		assert.Equal(t, "checkout:cart-42", a[idemotel.Action].AsString())
		assert.Equal(t, "succeeded", a[idemotel.Outcome].AsString())
		assert.Equal(t, http.MethodPost, a[semconv.HTTPRequestMethodKey].AsString())
		assert.Equal(t, e.srv.URL+"/payments", a[semconv.URLFullKey].AsString())
		assert.Equal(t, int64(http.StatusCreated), a[semconv.HTTPResponseStatusCodeKey].AsInt64())
		assert.NotContains(t, a, semconv.ErrorTypeKey)
		assert.Equal(t, codes.Unset, in.Status().Code)
		key := a[idemotel.Key].AsString()
		require.NotEmpty(t, key)

		requests := spans(e, "", trace.SpanKindClient)
		require.Len(t, requests, 2, "a CLIENT span per request")
		requireChildren(t, in.SpanContext(), requests...)
		assert.Equal(t, []int64{-1, 1}, resends(requests), "the resend only")
		first, second := attrs(requests[0].Attributes()), attrs(requests[1].Attributes())
		assert.Equal(t, codes.Error, requests[0].Status().Code, "the lost answer")
		assert.NotContains(t, first, semconv.HTTPResponseStatusCodeKey)
		assert.Equal(t, int64(http.StatusCreated), second[semconv.HTTPResponseStatusCodeKey].AsInt64())
		for _, r := range []map[attribute.Key]attribute.Value{first, second} {
			assert.Equal(t, http.MethodPost, r[semconv.HTTPRequestMethodKey].AsString())
			assert.Equal(t, e.srv.URL+"/payments", r[semconv.URLFullKey].AsString())
		}
	})

	// A URL with credentials in its user info and its query: no span of the
	// call holds one, and url.full is the conventions' redacted form.
	t.Run("no span holds a credential", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
		host := strings.TrimPrefix(e.srv.URL, "http://")
		raw := "http://merchant:pa55word@" + host + "/payments?access_token=t0ken&X-Amz-Signature=s1gnature&api_key=k3y&page=2#fr4gment"
		_, err := e.tr.Send(context.Background(), e.client, "checkout:secret", e.payment(t, raw, 100))
		require.NoError(t, err)

		want := "http://REDACTED:REDACTED@" + host + "/payments?access_token=REDACTED&X-Amz-Signature=REDACTED&api_key=REDACTED&page=2"
		all := e.exp.GetSpans().Snapshots()
		require.Len(t, all, 3, "the intent and two requests")
		for _, s := range all {
			assert.Equal(t, want, attrs(s.Attributes())[semconv.URLFullKey].AsString(), s.Name())
			kvs := append([]attribute.KeyValue(nil), s.Attributes()...)
			for _, ev := range s.Events() {
				kvs = append(kvs, ev.Attributes...)
			}
			texts := []string{s.Name(), s.Status().Description}
			for _, kv := range kvs {
				texts = append(texts, kv.Value.String())
			}
			for _, text := range texts {
				for _, secret := range []string{"merchant", "pa55word", "t0ken", "s1gnature", "k3y", "fr4gment"} {
					assert.NotContains(t, text, secret, "%s", s.Name())
				}
			}
		}
	})

	// A Send that runs out of attempts: an error status, the outcome unknown,
	// three requests. SettleAll at the next start, inside the app's span:
	// its span is a child of the app's, the intent's a child of it, with the
	// same key, and its request a child of the intent's.
	t.Run("SettleAll settles an unknown outcome under the app's span", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, Path: "/payments", Count: 3}))

		ctx := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 3})
		_, err := e.tr.Send(ctx, e.client, "checkout:cart-7", e.payment(t, e.srv.URL+"/payments", 700))
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		intents := spans(e, idemotel.IntentSpan, trace.SpanKindInternal)
		require.Len(t, intents, 1)
		sent := intents[0]
		a := attrs(sent.Attributes())
		assert.Equal(t, "unknown", a[idemotel.Outcome].AsString())
		assert.Equal(t, "idem.outcome_unknown", a[semconv.ErrorTypeKey].AsString())
		assert.Equal(t, int64(http.StatusServiceUnavailable), a[semconv.HTTPResponseStatusCodeKey].AsInt64())
		assert.Equal(t, codes.Error, sent.Status().Code)
		requests := spans(e, "", trace.SpanKindClient)
		require.Len(t, requests, 3)
		requireChildren(t, sent.SpanContext(), requests...)
		assert.Equal(t, []int64{-1, 1, 2}, resends(requests))
		key := a[idemotel.Key].AsString()

		start, app := e.tp.Tracer("app").Start(context.Background(), "app start")
		settled, err := e.tr.SettleAll(start, e.client)
		app.End()
		require.NoError(t, err)
		require.Len(t, settled, 1)
		require.NoError(t, settled[0].Err)

		all := spans(e, idemotel.SettleAllSpan, trace.SpanKindInternal)
		require.Len(t, all, 1)
		requireChildren(t, app.SpanContext(), all[0])
		intents = spans(e, idemotel.IntentSpan, trace.SpanKindInternal)
		require.Len(t, intents, 2)
		settle := intents[1]
		requireChildren(t, all[0].SpanContext(), settle)
		a = attrs(settle.Attributes())
		assert.Equal(t, key, a[idemotel.Key].AsString())
		assert.Equal(t, "succeeded", a[idemotel.Outcome].AsString())
		assert.Equal(t, codes.Unset, settle.Status().Code)
		requests = spans(e, "", trace.SpanKindClient)
		require.Len(t, requests, 4)
		requireChildren(t, settle.SpanContext(), requests[3])
		assert.False(t, settle.EndTime().After(all[0].EndTime()))
	})

	// Calls made without Send or the Tracer's SettleAll: the Transport opens
	// the intent's span under the call's context, and the hook ends it, with
	// the last attempt, or when the call's context ends in a wait.
	t.Run("calls without the Tracer get spans under their context", func(t *testing.T) {
		t.Parallel()
		t.Run("client.SettleAll's intents are children of its context's span", func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil)
			require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
			ctx := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 1})
			_, err := e.client.Send(ctx, "checkout:cart-9", e.payment(t, e.srv.URL+"/payments", 900))
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

			start, app := e.tp.Tracer("app").Start(context.Background(), "app start")
			settled, err := e.client.SettleAll(start)
			app.End()
			require.NoError(t, err)
			require.Len(t, settled, 1)
			require.NoError(t, settled[0].Err)

			intents := spans(e, idemotel.IntentSpan, trace.SpanKindInternal)
			require.Len(t, intents, 2, "the Send's, then the settle's")
			assert.False(t, intents[0].Parent().IsValid(), "the Send had no span")
			requireChildren(t, app.SpanContext(), intents[1])
			a := attrs(intents[1].Attributes())
			assert.Equal(t, settled[0].Intent.Key(), a[idemotel.Key].AsString())
			assert.Equal(t, int64(http.StatusCreated), a[semconv.HTTPResponseStatusCodeKey].AsInt64())
			assert.NotContains(t, a, idemotel.Outcome, "only the caller knows it")
			requests := spans(e, "", trace.SpanKindClient)
			require.Len(t, requests, 2)
			requireChildren(t, intents[1].SpanContext(), requests[1])
		})
		t.Run("a request through the RoundTripper is an intent span under the request's", func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil)
			require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
			ctx, span := e.tp.Tracer("app").Start(context.Background(), "refund")
			hreq, err := http.NewRequestWithContext(idem.ContextWithAction(ctx, "refund:1"), http.MethodPost, e.srv.URL+"/payments",
				strings.NewReader(`{"amount":100,"currency":"EUR","customer":"cus_1"}`))
			require.NoError(t, err)
			hreq.Header.Set("Content-Type", "application/json")
			hc := &http.Client{Transport: e.client.RoundTripper(e.tr.Transport(e.srv.Client().Transport))}
			resp, err := hc.Do(hreq)
			require.NoError(t, err)
			resp.Body.Close()
			span.End()
			require.Equal(t, http.StatusCreated, resp.StatusCode)

			intents := spans(e, idemotel.IntentSpan, trace.SpanKindInternal)
			require.Len(t, intents, 1)
			requireChildren(t, span.SpanContext(), intents[0])
			a := attrs(intents[0].Attributes())
			assert.Equal(t, int64(http.StatusCreated), a[semconv.HTTPResponseStatusCodeKey].AsInt64())
			assert.Equal(t, codes.Unset, intents[0].Status().Code)
			requests := spans(e, "", trace.SpanKindClient)
			require.Len(t, requests, 2)
			requireChildren(t, intents[0].SpanContext(), requests...)
			assert.Equal(t, []int64{-1, 1}, resends(requests))
		})
		t.Run("a call canceled in its wait ends its span", func(t *testing.T) {
			t.Parallel()
			var cancel context.CancelFunc
			e := setup(t, func(a idem.Attempt) {
				if a.Retry {
					cancel() // the user gives up as the wait begins
				}
			})
			require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
			in, err := e.client.NewIntent(context.Background(), "checkout:cart-3", e.payment(t, e.srv.URL+"/payments", 300))
			require.NoError(t, err)
			ctx, span := e.tp.Tracer("app").Start(context.Background(), "tap")
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			_, err = e.client.Do(ctx, in)
			span.End()
			require.ErrorIs(t, err, context.Canceled)
			select {
			case <-e.intentEnded:
			case <-time.After(time.Minute):
				t.Fatal("the intent's span never ended") // a guard against a hang, not a timing
			}

			intents := spans(e, idemotel.IntentSpan, trace.SpanKindInternal)
			require.Len(t, intents, 1, "ended with the call's context")
			requireChildren(t, span.SpanContext(), intents[0])
			assert.Equal(t, "context.Canceled", attrs(intents[0].Attributes())[semconv.ErrorTypeKey].AsString())
			assert.Equal(t, codes.Error, intents[0].Status().Code)
		})
	})
}

// RedactURL hides what idem's Attempt.URL hides, in the conventions'
// words.
func TestRedactURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"https://api.example/payments":                                                    "https://api.example/payments",
		"https://sk_live_1:@api.example/payments":                                         "https://REDACTED:REDACTED@api.example/payments",
		"https://api.example/p?sig=1&Signature=2&AWSAccessKeyId=3&X-Goog-Signature=4&q=5": "https://api.example/p?sig=REDACTED&Signature=REDACTED&AWSAccessKeyId=REDACTED&X-Goog-Signature=REDACTED&q=5",
		"https://api.example/p?pass_word=1&client.secret=2&%61pi_key=3":                   "https://api.example/p?pass_word=REDACTED&client.secret=REDACTED&%61pi_key=REDACTED",
		"https://api.example/p#access_token=1":                                            "https://api.example/p",
		"::":                                                                              "REDACTED",
	} {
		assert.Equal(t, want, idemotel.RedactURL(raw), raw)
	}
}
