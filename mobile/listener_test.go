package mobile

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

// TestListener checks the events a Listener gets of a call's attempts.
func TestListener(t *testing.T) {
	t.Run("the listener never blocks the call", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		l := &blockingListener{release: make(chan struct{})}
		c := w.open(t, func(cfg *Config) { cfg.Listener = l })
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, Count: 3})

		res, err := c.Pay("checkout:cart-8", "/payments", []byte(cart), nil)
		require.NoError(t, err, "the call returns while the listener is stuck in its first event")
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		close(l.release)
		require.NoError(t, c.Close())
		assert.Equal(t, int64(4), l.got.Load(), "every attempt was delivered once the listener moved on")
	})

	t.Run("the events describe the attempts", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var (
			mu     sync.Mutex
			events []AttemptEvent
		)
		c := w.open(t, func(cfg *Config) {
			cfg.Listener = listenerFunc(func(e *AttemptEvent) {
				mu.Lock()
				events = append(events, *e)
				mu.Unlock()
			})
		})
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, RetryAfter: "2"})
		res, err := c.Pay("checkout:cart-9", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.NoError(t, c.Close())
		require.Len(t, events, 2)
		assert.Equal(t, AttemptEvent{Key: res.Key, Number: 1, Status: 503, Retry: true, WaitMillis: events[0].WaitMillis}, events[0])
		assert.GreaterOrEqual(t, events[0].WaitMillis, int64(2000), "never sooner than the server asked")
		assert.Equal(t, AttemptEvent{Key: res.Key, Number: 2, Status: 201}, events[1])
	})
}
