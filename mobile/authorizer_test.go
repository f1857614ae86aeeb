package mobile

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
)

// TestAuthorizer checks the credentials the Authorizer puts on each
// attempt, and what its failure says of the payment.
func TestAuthorizer(t *testing.T) {
	t.Parallel()
	t.Run("a failure before any attempt leaves the intent not sent for the changed cart and the next start", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		failing := w.open(t, func(cfg *Config) {
			cfg.Authorizer = authorizerFunc(func(string) (string, error) { return "", errors.New("token refresh failed") })
		})
		res, err := failing.Pay("checkout:cart-1", "/payments", []byte(cart), nil)
		require.NoError(t, err, "what became of the intent is a Result")
		assert.Equal(t, OutcomeNotSent, res.Outcome)
		assert.Equal(t, KindAuthorizer, res.Kind, "the facade says why")
		require.NoError(t, failing.Close())

		c := w.open(t)
		changed, err := c.Pay("checkout:cart-1", "/payments", []byte(`{"amount":2500,"currency":"AZN","customer":"cus_1"}`), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, changed.Outcome, "the changed cart is not blocked")
		left, err := c.SettleAll(nil)
		require.NoError(t, err)
		assert.Zero(t, left.Len(), "nothing is left to send")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges, "the first cart is never charged")
	})

	// The facade's only way to send credentials is Config.Authorizer.
	// Path: Pay is sent with the Authorizer's "Bearer test_alice_1" and
	// charged under alice; its answer is lost (MaxAttempts 1: unknown).
	// Once the intent is too old to send, Settle asks the lookup. Sent
	// without asking the Authorizer, it would go out with no
	// Authorization: the server answers for the anonymous caller, who
	// never used the key (the typed miss), and Settle would return
	// OutcomeVoid: "a new payment is safe". The app would pay anew: alice
	// charged twice.
	t.Run("Settle's lookup of a payment too old to send acts for the Authorizer's caller", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) {
			cfg.Authorizer = authorizerFunc(func(string) (string, error) { return "Bearer test_alice_1", nil })
			cfg.MaxAttempts = 1
			cfg.RetentionMillis = 2000 // too old to send two seconds after the tap
		})
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
		res, err := c.Pay("checkout:cart-3", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeUnknown, res.Outcome)
		require.Equal(t, 1, w.srv.Stats().ProviderCharges)

		w.clock.Advance(2*time.Minute + 5*time.Second) // past the reconcile delay
		got, err := c.Settle(res.Key, nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, got.Outcome, "alice's payment is found: %s", got.Detail)
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})
	t.Run("a value net/http cannot send ends the call of kind authorizer and is never shown", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var calls atomic.Int32
		c := w.open(t, func(cfg *Config) {
			cfg.Authorizer = authorizerFunc(func(string) (string, error) {
				calls.Add(1)
				return "Bearer test_alice_SECRET\n", nil
			})
		})
		res, err := c.Pay("checkout:cart-8", "/payments", []byte(cart), nil)
		require.NoError(t, err, "what became of the intent is a Result")
		assert.Equal(t, OutcomeNotSent, res.Outcome)
		assert.Equal(t, KindAuthorizer, res.Kind, "the app signs in again")
		assert.Contains(t, res.Detail, "not a valid header field value")
		assert.NotContains(t, res.Detail, "SECRET", "the value is a credential")
		assert.Equal(t, int32(1), calls.Load(), "no retry can fix it")
		assert.Zero(t, w.srv.Stats().Requests)
	})

	t.Run("credentials are put on each attempt", func(t *testing.T) {
		t.Parallel()
		var seen []string
		var mu sync.Mutex
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, r.Header.Get("Authorization"))
			n := len(seen)
			mu.Unlock()
			w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key")) // the server marks its answers
			if n == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(srv.Close)
		var calls atomic.Int64
		cfg := echoConfig(stateDir(t), srv.URL)
		cfg.Authorizer = authorizerFunc(func(key string) (string, error) {
			return "Bearer token-" + string(rune('0'+calls.Add(1))), nil
		})
		c, err := open(cfg, withClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })

		res, err := c.Pay("checkout:cart-6", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.Equal(t, []string{"Bearer token-1", "Bearer token-2"}, seen, "asked afresh for every attempt")
	})

	// The API redirects the payment (307) to another origin. net/http drops
	// the Authorization header on such a redirect; the Authorizer must not
	// put it back, or whoever can answer with a redirect (a misconfigured
	// proxy, an open redirect) gets the user's token, over plain http if the
	// Location says so.
	t.Run("credentials stay with the API's origin", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		var apiSaw, otherSaw []string
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			otherSaw = append(otherSaw, r.Header.Get("Authorization"))
			mu.Unlock()
			w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(other.Close)
		// The same machine under another name: another origin.
		elsewhere := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			apiSaw = append(apiSaw, r.Header.Get("Authorization"))
			mu.Unlock()
			http.Redirect(w, r, elsewhere+"/payments", http.StatusTemporaryRedirect)
		}))
		t.Cleanup(api.Close)

		cfg := echoConfig(stateDir(t), api.URL)
		cfg.Authorizer = authorizerFunc(func(string) (string, error) { return "Bearer secret-session", nil })
		c, err := open(cfg, withClock(clock.NewManual(epoch)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })

		_, _ = c.Pay("checkout:cart-redirect", "/payments", []byte(cart), nil)
		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, apiSaw)
		assert.Equal(t, "Bearer secret-session", apiSaw[0], "the API itself gets the credentials")
		require.NotEmpty(t, otherSaw, "the redirect is followed")
		for _, v := range otherSaw {
			assert.Empty(t, v, "the credentials went to another origin")
		}
	})

	// The Authorizer gives every attempt a fresh token of one account; the
	// first answer is lost and the retry, under the new token, replays: one
	// charge.
	t.Run("a refresh between attempts is one charge", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var calls atomic.Int64
		c := w.open(t, func(cfg *Config) {
			cfg.Authorizer = authorizerFunc(func(string) (string, error) {
				return fmt.Sprintf("Bearer test_acme_token-%d", calls.Add(1)), nil
			})
		})
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})

		res, err := c.Pay("checkout:cart-refresh", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.True(t, res.Replayed, "the retry under the refreshed token got the stored answer")
		assert.Equal(t, int64(2), res.Attempts)
		assert.Equal(t, int64(2), calls.Load(), "a token per attempt")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})

	t.Run("a failure before any attempt is an unsent Result of kind authorizer", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) {
			cfg.Authorizer = authorizerFunc(func(string) (string, error) { return "", errors.New("no session") })
		})

		res, err := c.Pay("checkout:cart-7", "/payments", []byte(cart), nil)
		require.NoError(t, err, "what became of the intent is a Result")
		assert.Equal(t, OutcomeNotSent, res.Outcome)
		assert.Equal(t, KindAuthorizer, res.Kind)
		assert.NotEmpty(t, res.Key)
		assert.Contains(t, res.Detail, "no session")
		assert.Equal(t, 0, w.srv.Stats().Requests, "no attempt was sent, and none was retried")
	})

	// The first attempt reaches the server, which charges, and its answer is
	// lost; the session then ends and the Authorizer fails for the retry. The
	// payment may have been made: Pay says the outcome is unknown, never the
	// device error whose meaning is that nothing was sent.
	t.Run("a failure after an attempt was sent leaves the outcome unknown", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var calls atomic.Int64
		c := w.open(t, func(cfg *Config) {
			cfg.Authorizer = authorizerFunc(func(string) (string, error) {
				if calls.Add(1) > 1 {
					return "", errors.New("session expired")
				}
				return "Bearer token-1", nil
			})
		})
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})

		res, err := c.Pay("checkout:auth-late", "/payments", []byte(cart), nil)
		require.NoError(t, err, "an attempt was sent: the outcome is unknown, not a device error")
		assert.Equal(t, OutcomeUnknown, res.Outcome)
		assert.Equal(t, KindAuthorizer, res.Kind)
		assert.NotEmpty(t, res.Key, "the intent to Settle later")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})
}
