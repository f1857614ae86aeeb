package mobile

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Cancel serves one call at a time: the call it stopped spends it, and
// the next call it is passed to runs, rather than reporting a
// cancellation the user never asked of it.
func TestACancelIsSpentByTheCallItStopped(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.open(t)

	cancel := &Cancel{}
	cancel.Cancel() // before the call starts: it returns at once
	_, err := c.Pay("checkout:cart-9", "/payments", []byte(cart), cancel)
	require.Error(t, err)
	assert.Equal(t, KindCanceled, ErrorKind(err))
	assert.Equal(t, 0, w.srv.Stats().Requests)

	res, err := c.Pay("checkout:cart-9", "/payments", []byte(cart), cancel)
	require.NoError(t, err, "the handle was spent by the call it stopped")
	assert.Equal(t, OutcomeSucceeded, res.Outcome)
	assert.Equal(t, 1, w.srv.Stats().Payments)

	cancel.Cancel() // after the call ended: the next call returns at once
	_, err = c.Pay("checkout:cart-10", "/payments", []byte(cart), cancel)
	require.Error(t, err)
	assert.Equal(t, KindCanceled, ErrorKind(err))
	assert.Equal(t, 1, w.srv.Stats().Requests)
}
