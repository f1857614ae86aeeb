package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A Do of a never-sent intent that Client.Intent replaced for a changed
// request returns ErrIntentReplaced and sends nothing.
func TestDoOfAReplacedIntentReturnsErrIntentReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	old, err := e.client.Intent(ctx, "checkout:replaced", e.paymentRequest(t, 100, "cus_1"))
	require.NoError(t, err)
	_, err = e.client.Intent(ctx, "checkout:replaced", e.paymentRequest(t, 200, "cus_1"))
	require.NoError(t, err)

	_, err = e.client.Do(ctx, old)
	require.ErrorIs(t, err, idem.ErrIntentReplaced)
	assert.Equal(t, 0, e.srv.Stats().Requests)
}
