package idem_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// TestReconcileNeverVoidsAnOrderThatWasMade: what the app is told is
// true. Path: the fake server serves the app's own POST /orders
// (Options.Endpoints) beside its payments; the app's Server.Lookup asks
// the fake's one lookup, GET /payments?idempotency_key=K, for every
// intent. A drop_response fault loses the answer to the order (the order
// is made, its record COMPLETED), so Do ends ErrOutcomeUnknown. Past the
// reconcile delay, Reconcile asks the lookup: the fake finds K's completed
// record, no payment under it, and answers the typed miss
// idempotency-key-unused with the key's echo and the lookup's nonce. The
// client voids the intent: the app is told the order was never made, and
// a second tap makes a second order.
func TestReconcileNeverVoidsAnOrderThatWasMade(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	orders := 0
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1"}`)
	})
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk,
		Endpoints: []fakeserver.Endpoint{{Pattern: "POST /orders", Handler: createOrder}}})
	t.Cleanup(srv.Close)

	store, err := persist.OpenDir(filepath.Join(t.TempDir(), "intents"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	client, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Clock: clk,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 1},
		Server: idem.Server{Mark: idem.MarkEcho, Lookup: func(_ idem.Request, key string) string {
			return srv.URL + "/payments?idempotency_key=" + key
		}}})
	require.NoError(t, err)

	ctx := context.Background()
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/orders", map[string]any{"sku": "tea"})
	require.NoError(t, err)
	in, err := client.Intent(ctx, "order:cart-7", req)
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
	_, err = client.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 1, orders)

	clk.Advance(10 * time.Minute) // past the reconcile delay and the lease
	resp, err := client.Reconcile(ctx, in)
	if resp != nil {
		t.Logf("lookup answered %d %s", resp.StatusCode, resp.Body)
	}
	t.Logf("Reconcile: state %s, err %v", in.State(), err)
	require.NotEqual(t, persist.StateVoid, in.State(),
		"the order was made under %s, and the client was told nothing was", in.Key())
}
