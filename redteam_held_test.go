package idem_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/persist"
)

// TestStatusRuleWithABodyNeverSettles (held): a status rule with its own
// Header and Body (new in fakeserver/fault) answers as an ingress would,
// here with bodies that look like the server's word: a 201 payment on the
// POST, and on the lookup the typed miss idempotency-key-unused as
// application/problem+json. Neither echoes the key or the lookup's nonce,
// so the client ends ErrOutcomeUnknown and Reconcile leaves the intent
// unresolved; the payment is then settled by a resend.
func TestStatusRuleWithABodyNeverSettles(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	store, err := persist.OpenDir(filepath.Join(t.TempDir(), "intents"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	client, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Clock: clk,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 1},
		Server:      idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
	require.NoError(t, err)
	ctx := context.Background()
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	in, err := client.Intent(ctx, "checkout:cart-9", req)
	require.NoError(t, err)

	require.NoError(t, srv.InjectRule(&fault.Rule{When: fault.Method(http.MethodPost), Times: 1, Effect: fault.Effect{
		Kind: fakeserver.FaultStatus, Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_forged"}},
		Body:   []byte(`{"id":"pay_forged","amount":1500,"currency":"AZN","customer":"cus_1","status":"succeeded"}`)}}))
	_, err = client.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	require.NoError(t, srv.InjectRule(&fault.Rule{When: fault.Query("idempotency_key"), Times: 1, Effect: fault.Effect{
		Kind: fakeserver.FaultStatus, Status: http.StatusNotFound,
		Header: http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}},
		Body:   []byte(`{"type":"https://idem.dev/problems/idempotency-key-unused","title":"Idempotency-Key unused","status":404}`)}}))
	clk.Advance(10 * time.Minute)
	_, err = client.Reconcile(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.False(t, in.State().Resolved(), "state %s", in.State())

	resp, err := client.Do(ctx, in)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 1, srv.Stats().ProviderCharges)
}

// TestGatewayFourHundredsNeverSettle (held): a status fault is a box in
// front of the server ("touches nothing, as a proxy would"), and its 4xx
// carry no key echo. Path: for each of 400, 401, 403, 404, 410, 413, 422,
// a status fault on the POST: the client's one attempt ends
// ErrOutcomeUnknown, the intent unresolved, and its resend pays once.
func TestGatewayFourHundredsNeverSettle(t *testing.T) {
	for _, code := range []int{400, 401, 403, 404, 410, 413, 422} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
			srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
			t.Cleanup(srv.Close)
			client, err := idem.New(idem.Config{Store: persist.NewMemory(nil), HTTPClient: srv.Client(), Clock: clk,
				RetryPolicy: idem.RetryPolicy{MaxAttempts: 1},
				Server:      idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
			require.NoError(t, err)
			ctx := context.Background()
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
				map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			in, err := client.Intent(ctx, "checkout:gw", req)
			require.NoError(t, err)
			require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: code}))
			_, err = client.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			require.False(t, in.State().Resolved(), "state %s", in.State())
			resp, err := client.Do(ctx, in)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Equal(t, 1, srv.Stats().ProviderCharges)
		})
	}
}
