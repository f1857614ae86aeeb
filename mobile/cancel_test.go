package mobile

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// TestCancel checks that a Cancel stops the call it is passed to, and
// only that call.
func TestCancel(t *testing.T) {
	t.Run("a Cancel from another goroutine stops the call", func(t *testing.T) {
		t.Parallel()
		arrived := make(chan struct{}, 1)
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Read the body, so the server watches the connection and ends
			// the request's context when the client goes away.
			_, _ = io.Copy(io.Discard, r.Body)
			arrived <- struct{}{}
			<-r.Context().Done()
		}))
		t.Cleanup(hang.Close)
		c, err := Open(echoConfig(stateDir(t), hang.URL))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })

		cancel := &Cancel{}
		go func() {
			<-arrived
			cancel.Cancel()
		}()
		res, err := c.Pay("checkout:cart-4", "/payments", []byte(cart), cancel)
		assert.Nil(t, res)
		require.Error(t, err)
		assert.Equal(t, KindCanceled, ErrorKind(err))

		unresolved, err := c.Unresolved()
		require.NoError(t, err)
		assert.Equal(t, int64(1), unresolved.Len(), "the cancelled intent stays to be settled")

		done := &Cancel{}
		done.Cancel()
		_, err = c.Settle(unresolved.Get(0).Key, done)
		assert.Equal(t, KindCanceled, ErrorKind(err), "a handle cancelled before the call stops it at once")
	})

	// A Cancel serves one call at a time: the call it stopped spends it, and
	// the next call it is passed to runs, rather than reporting a
	// cancellation the user never asked of it.
	t.Run("a Cancel is spent by the call it stopped", func(t *testing.T) {
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
	})

	// A Cancel pressed after the server answered does not unsay the answer:
	// the payment was made, and Pay returns its Result.
	t.Run("a Cancel after the answer still returns the answer", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		cancel := &Cancel{}
		c, err := open(echoConfig(w.dir, w.srv.URL), withClock(w.clock),
			func(c *idem.Config) { c.Store = fullAfterAnswerCancelled{persist.NewMemory(nil), cancel} })
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		res, err := c.Pay("checkout:cancelled-late", "/payments", []byte(cart), cancel)
		require.NoError(t, err, "the payment was sent and answered")
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.True(t, res.NotRecorded)
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})
}
