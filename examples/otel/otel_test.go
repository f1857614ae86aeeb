package idemotel_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/examples/otel"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// setup is a fake payments server, a Client that traces through tr, and
// the recorder that holds the spans it ends.
func setup(t *testing.T) (*fakeserver.Server, *idem.Client, *idemotel.Tracer, *sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := idemotel.New(tp)
	client, err := idem.New(idem.Config{
		HTTPClient:  srv.Client(),
		Store:       persist.NewMemory(nil),
		Clock:       clk,
		RetryPolicy: idem.RetryPolicy{Jitter: -1},
		Server:      idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
		OnAttempt:   tr.Hook,
	})
	require.NoError(t, err)
	return srv, client, tr, tp, rec
}

func payment(t *testing.T, srv *fakeserver.Server, amount int) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{
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

// A Send whose first answer is lost: one span, a child of the caller's,
// with an event per attempt and one resend.
func TestSendIsASpanWithAnEventPerAttempt(t *testing.T) {
	t.Parallel()
	srv, client, tr, tp, rec := setup(t)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))

	ctx, parent := tp.Tracer("app").Start(context.Background(), "checkout")
	resp, err := tr.Send(ctx, client, "checkout:cart-42", payment(t, srv, 1500))
	parent.End()
	require.NoError(t, err)
	require.True(t, resp.Replayed)

	spans := rec.Ended()
	require.Len(t, spans, 2, "the intent's span and the caller's")
	s := spans[0]
	assert.Equal(t, idemotel.SpanName, s.Name())
	assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the caller's span")
	a := attrs(s.Attributes())
	assert.Equal(t, int64(1), a[idemotel.ResendCount].AsInt64())
	assert.Equal(t, int64(1), a[idemotel.RequestResendCount].AsInt64())
	assert.Equal(t, int64(2), a[idemotel.Attempts].AsInt64())
	assert.Equal(t, "checkout:cart-42", a[idemotel.Action].AsString())
	assert.Equal(t, "succeeded", a[idemotel.Outcome].AsString())
	assert.Equal(t, srv.URL+"/payments", a[idemotel.URL].AsString())
	key := a[idemotel.Key].AsString()
	assert.NotEmpty(t, key)
	assert.Equal(t, codes.Unset, s.Status().Code)

	events := s.Events()
	require.Len(t, events, 2)
	first, second := attrs(events[0].Attributes), attrs(events[1].Attributes)
	assert.Equal(t, idemotel.EventName, events[0].Name)
	assert.Equal(t, int64(1), first[idemotel.Attempt].AsInt64())
	assert.True(t, first[idemotel.Retry].AsBool())
	assert.Equal(t, int64(500), first[idemotel.WaitMS].AsInt64(), "the first backoff, without jitter")
	assert.NotEmpty(t, first[idemotel.ErrorMsg].AsString(), "the lost answer's error")
	assert.Equal(t, key, first[idemotel.Key].AsString())
	assert.Equal(t, int64(2), second[idemotel.Attempt].AsInt64())
	assert.False(t, second[idemotel.Retry].AsBool())
	assert.Equal(t, int64(http.StatusCreated), second[idemotel.Status].AsInt64())
}

// A Send that runs out of attempts ends its span with an error status and
// the outcome unknown; SettleAll at the next start gets a span of its own
// for the intent, opened and ended by the hook.
func TestUnknownOutcomeAndSettleAllAreSpansToo(t *testing.T) {
	t.Parallel()
	srv, client, tr, _, rec := setup(t)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, Path: "/payments", Count: 3}))

	ctx := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 3})
	_, err := tr.Send(ctx, client, "checkout:cart-7", payment(t, srv, 700))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	spans := rec.Ended()
	require.Len(t, spans, 1)
	a := attrs(spans[0].Attributes())
	assert.Equal(t, int64(2), a[idemotel.ResendCount].AsInt64())
	assert.Equal(t, "unknown", a[idemotel.Outcome].AsString())
	assert.Equal(t, codes.Error, spans[0].Status().Code)
	require.Len(t, spans[0].Events(), 3)
	for i, e := range spans[0].Events() {
		ea := attrs(e.Attributes)
		assert.Equal(t, int64(http.StatusServiceUnavailable), ea[idemotel.Status].AsInt64())
		assert.Equal(t, i < 2, ea[idemotel.Retry].AsBool())
	}

	settled, err := client.SettleAll(context.Background())
	require.NoError(t, err)
	require.Len(t, settled, 1)
	require.NoError(t, settled[0].Err)
	spans = rec.Ended()
	require.Len(t, spans, 2)
	s := spans[1]
	assert.False(t, s.Parent().IsValid(), "a span of its own")
	a = attrs(s.Attributes())
	assert.Equal(t, "checkout:cart-7", a[idemotel.Action].AsString())
	assert.Equal(t, int64(0), a[idemotel.ResendCount].AsInt64())
	assert.Equal(t, codes.Unset, s.Status().Code)
	require.Len(t, s.Events(), 1)
	assert.Equal(t, int64(http.StatusCreated), attrs(s.Events()[0].Attributes)[idemotel.Status].AsInt64())
}
