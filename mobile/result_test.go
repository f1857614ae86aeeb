package mobile

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// answering is a server that gives every request one answer, marked as
// the server's: it echoes the request's Idempotency-Key.
func answering(t *testing.T, status int, contentType, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// failingWrites is a store whose writes of a record in one of the
// states fail, as a full disk's would.
type failingWrites struct {
	persist.Store
	states []persist.State
}

func (s failingWrites) Write(ctx context.Context, rec, old *persist.Record) error {
	for _, st := range s.states {
		if rec.State == st {
			return errors.New("no space left on device")
		}
	}
	return s.Store.Write(ctx, rec, old)
}

// TestResultKind: every way a call ends is a code in Result.Kind, read
// without parsing a message.
func TestResultKind(t *testing.T) {
	t.Parallel()
	const changed = `{"amount":2500,"currency":"AZN","customer":"cus_1"}`

	t.Run("a payment made is succeeded", func(t *testing.T) {
		t.Parallel()
		res, err := newWorld(t).open(t).Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.Equal(t, KindSucceeded, res.Kind)
	})

	t.Run("a declined card is failed", func(t *testing.T) {
		t.Parallel()
		res, err := newWorld(t).open(t).Pay("checkout:1", "/payments", []byte(`{"amount":1500,"currency":"AZN","customer":"cus_declined"}`), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeFailed, res.Outcome)
		assert.Equal(t, KindFailed, res.Kind)
	})

	t.Run("a key the server saw with another request is key_reused, from the server and from the device", func(t *testing.T) {
		t.Parallel()
		url := answering(t, http.StatusUnprocessableEntity, "application/problem+json",
			`{"type":"https://idem.dev/problems/idempotency-key-reused","title":"key reused","status":422}`)
		c, err := Open(echoConfig(stateDir(t), url))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		for _, from := range []string{"the server", "the device"} {
			res, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
			require.NoError(t, err, from)
			assert.Equal(t, OutcomeRejected, res.Outcome, from)
			assert.Equal(t, KindKeyReused, res.Kind, from)
		}
	})

	t.Run("a key the server refused is key_rejected", func(t *testing.T) {
		t.Parallel()
		url := answering(t, http.StatusBadRequest, "application/problem+json",
			`{"type":"https://idem.dev/problems/idempotency-key-invalid","title":"bad key","status":400}`)
		c, err := Open(echoConfig(stateDir(t), url))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		res, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeRejected, res.Outcome)
		assert.Equal(t, KindKeyRejected, res.Kind)
	})

	t.Run("an offline tap is not_sent", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var down atomic.Bool
		down.Store(true)
		c, err := open(echoConfig(w.dir, w.srv.URL), withClock(w.clock), offlineClient(&down))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		res, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeNotSent, res.Outcome)
		assert.Equal(t, KindNotSent, res.Kind)
	})

	t.Run("no final answer is unknown, and a changed cart then blocked", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) { cfg.MaxAttempts = 2 })
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, Count: 5})
		res, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeUnknown, res.Outcome)
		assert.Equal(t, KindUnknown, res.Kind)

		blocked, err := c.Pay("checkout:1", "/payments", []byte(changed), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeBlocked, blocked.Outcome)
		assert.Equal(t, KindBlocked, blocked.Kind)
	})

	t.Run("a payment too old to send again is expired", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) {
			cfg.MaxAttempts = 1
			cfg.RetentionMillis = 2000 // too old to send two seconds after the tap
		})
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, Count: 5})
		first, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeUnknown, first.Outcome)

		w.clock.Advance(5 * time.Second)
		res, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeExpired, res.Outcome)
		assert.Equal(t, KindExpired, res.Kind)
		assert.Equal(t, first.Key, res.Key, "the intent to settle")
	})

	t.Run("a changed cart of a paid action is already_paid", func(t *testing.T) {
		t.Parallel()
		c := newWorld(t).open(t)
		_, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		res, err := c.Pay("checkout:1", "/payments", []byte(changed), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeAlreadyPaid, res.Outcome)
		assert.Equal(t, KindAlreadyPaid, res.Kind)
	})

	t.Run("a write that fails after an attempt was sent is unknown of kind storage", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		cfg := echoConfig(w.dir, w.srv.URL)
		cfg.MaxAttempts = 2
		c, err := open(cfg, withClock(w.clock),
			func(c *idem.Config) {
				c.Store = failingWrites{persist.NewMemory(nil), []persist.State{persist.StatePending}}
			})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, Count: 5})
		res, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err, "the payment may have been made: a storage error would say nothing was sent")
		assert.Equal(t, OutcomeUnknown, res.Outcome)
		assert.Equal(t, KindStorage, res.Kind)
	})

	t.Run("a not-sent write that fails is unknown of kind storage, never not_sent", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var down atomic.Bool
		down.Store(true)
		c, err := open(echoConfig(w.dir, w.srv.URL), withClock(w.clock), offlineClient(&down),
			func(c *idem.Config) {
				c.Store = failingWrites{persist.NewMemory(nil), []persist.State{persist.StateNotSent}}
			})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		res, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeUnknown, res.Outcome, "the store still says armed: the next start may send it")
		assert.Equal(t, KindStorage, res.Kind)
	})

	// A device failure on an intent that may have been sent says nothing of
	// the payment: the Result says the outcome is unknown, with the failure's
	// kind. On an intent provably unsent it is an error of the device.
	t.Run("a device failure on an intent that may have been sent is unknown", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, Count: 5})
		first, err := c.Pay("checkout:1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeUnknown, first.Outcome)
		in, err := c.idem.Load(context.Background(), first.Key)
		require.NoError(t, err)
		require.Equal(t, persist.StatePending, in.State())

		// A store failure whose write did not land, say, or any other.
		failure := &idem.SaveError{Key: first.Key, Op: "record attempts", Err: errors.New("input/output error")}
		res, err := resultOf(in, nil, failure)
		require.NoError(t, err, "an error would say that nothing was sent")
		assert.Equal(t, OutcomeUnknown, res.Outcome)
		assert.Equal(t, KindStorage, res.Kind)
		assert.Equal(t, first.Key, res.Key, "the intent to settle")

		unsent, err := c.idem.Intent(context.Background(), "checkout:2", idem.Request{Method: http.MethodPost, URL: w.srv.URL + "/payments", Body: []byte(cart)})
		require.NoError(t, err)
		require.Equal(t, persist.StateNew, unsent.State())
		res, err = resultOf(unsent, nil, failure)
		assert.Nil(t, res)
		assert.Equal(t, KindStorage, ErrorKind(err), "nothing was sent: the device failed")
	})
}
