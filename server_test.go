package idem_test

import (
	"context"
	"math"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// A credential's field name is refused however its words are joined: with
// an underscore or a dot as well as a hyphen, in any case. Each is a valid
// field name a server can send, and the device must never keep it.
func TestServerStoredHeadersRefusesCredentialsSpelledAnyWay(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"X-Api_Key", "X_API_KEY", "api.key", "X-Access_Key", "Private_Key", "x-apikey", "X-SET-COOKIE"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := idem.New(idem.WithServer(idem.Server{StoredHeaders: []string{name}}))
			require.Error(t, err, "%q carries a credential", name)
			assert.Nil(t, c)
			assert.Contains(t, err.Error(), "credentials")
		})
	}
	// Names that only look alike are kept.
	for _, name := range []string{"X-Request-Id", "X-Rate-Limit-Remaining", "Etag"} {
		_, err := idem.New(idem.WithServer(idem.Server{StoredHeaders: []string{name}}))
		assert.NoError(t, err, name)
	}
}

// The largest MaxResponseBytes keeps every answer whole, the lookup's
// included: the bound is one past the limit, which must not wrap around to
// a bound of nothing, or the lookup of a payment whose answer was lost
// would settle it succeeded with its receipt empty.
func TestServerMaxResponseBytesAtItsLargestKeepsTheLookupsBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}),
		idem.WithServer(idem.Server{LookupQuery: "idempotency_key", MaxResponseBytes: math.MaxInt64}))
	in := e.newIntent(t, "checkout:largest", 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	resp, err := e.client.Reconcile(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, persist.StateSucceeded, in.State())
	assert.Equal(t, 1500, decodePayment(t, resp.Body).Amount, "the lookup's answer is read whole")
	stored := in.Response()
	require.NotNil(t, stored)
	assert.Equal(t, 1500, decodePayment(t, stored.Body).Amount, "and kept whole")
}
