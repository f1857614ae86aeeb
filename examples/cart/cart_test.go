package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
)

func TestRun(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	assert.Contains(t, out.String(), "A was never sent, so it was replaced (A deleted: true)")
	assert.Contains(t, out.String(), "refused, intent B")
	assert.Contains(t, out.String(), "settled B: succeeded")
	assert.Contains(t, out.String(), "server: 2 payments, 2 provider charges")
}

// pendingIntent leaves an intent whose one attempt hit fault kind.
func pendingIntent(t *testing.T, srv *fakeserver.Server, kind fakeserver.FaultKind) (*idem.Client, *idem.Intent) {
	t.Helper()
	ctx := context.Background()
	client, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	in, err := intentFor(ctx, client, srv.URL, cart{items: []string{"book"}, amount: 1500})
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: kind, Key: in.Key()}))
	_, err = client.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, idem.StatePending, in.State())
	return client, in
}

// The server did the work: settling asks and sends nothing again.
func TestSettleFindsThePayment(t *testing.T) {
	t.Parallel()
	srv := fakeserver.Start(t, nil)
	client, in := pendingIntent(t, srv, fakeserver.FaultDropResponse)

	resp, err := settle(context.Background(), client, in, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the lookup's answer")
	assert.Equal(t, idem.StateSucceeded, in.State())
	st := srv.Stats()
	assert.Equal(t, 1, st.Executions, "no POST was sent again")
	assert.Equal(t, 1, st.ProviderCharges)
}

// The request never reached the server, and too recently to trust a 404:
// settling resumes the intent, which pays once.
func TestSettleResumes(t *testing.T) {
	t.Parallel()
	srv := fakeserver.Start(t, nil)
	client, in := pendingIntent(t, srv, fakeserver.FaultReset)
	require.Zero(t, srv.Stats().Executions)

	resp, err := settle(context.Background(), client, in, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "the resumed payment's answer")
	assert.Equal(t, idem.StateSucceeded, in.State())
	assert.Equal(t, 1, srv.Stats().ProviderCharges)
}
