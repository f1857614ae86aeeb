package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
)

// TestErrorTexts: the text of a call's error names the call the app made
// as the one to make again, and only calls that exist.
func TestErrorTexts(t *testing.T) {
	t.Parallel()
	unavailable := func(t *testing.T) (*idem.Client, idem.Request) {
		return answering(t, func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	}
	ctx := context.Background()
	t.Run("after Send it says to call Send again", func(t *testing.T) {
		t.Parallel()
		c, req := unavailable(t)
		_, err := c.Send(ctx, "checkout", req)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Contains(t, err.Error(), "call Send again later with the same name and request")
		assert.NotContains(t, err.Error(), "Do")
	})
	t.Run("after Settle it says to call Settle again", func(t *testing.T) {
		t.Parallel()
		c, req := unavailable(t)
		in, err := c.NewIntent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Settle(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Contains(t, err.Error(), "call Settle again later")
		assert.NotContains(t, err.Error(), "Do")
	})
	t.Run("after Do it says to call Do again", func(t *testing.T) {
		t.Parallel()
		c, req := unavailable(t)
		in, err := c.NewIntent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Contains(t, err.Error(), "call Do (or Settle) again later")
	})
	t.Run("after SettleAll it says to call SettleAll again", func(t *testing.T) {
		t.Parallel()
		c, req := unavailable(t)
		in, err := c.NewIntent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		settled, err := c.SettleAll(ctx)
		require.NoError(t, err)
		require.Len(t, settled, 1)
		assert.Contains(t, settled[0].Err.Error(), "call SettleAll (or Settle) again later")
	})
	t.Run("a changed request names the calls that exist", func(t *testing.T) {
		t.Parallel()
		c, req := unavailable(t)
		_, err := c.Send(ctx, "checkout", req)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		changed, err := idem.JSONRequest(http.MethodPost, req.URL, map[string]any{"amount": 200})
		require.NoError(t, err)
		_, err = c.Send(ctx, "checkout", changed)
		var unresolved *idem.UnresolvedError
		require.ErrorAs(t, err, &unresolved)
		assert.Contains(t, err.Error(), "Settle")
		assert.Contains(t, err.Error(), "Reconcile")
		assert.Contains(t, err.Error(), "Forget")
		assert.NotContains(t, strings.ToLower(err.Error()), "resume")
	})

	// The errors a call returns, which apps log, carry no credential of the
	// intent's URL, as the attempt hook's URL does not: not a secret key sent
	// as the user name, not a password, not a query parameter named for a
	// credential. Each stays what it is to errors.Is and errors.As.
	t.Run("they carry no credential of the intent's URL", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		// withSecrets puts every kind of credential into the URL of base.
		withSecrets := func(base string) string {
			return strings.Replace(base, "http://", "http://sk_live_SECRET1:SECRET2@", 1) + "/payments?cart=42&access_token=SECRET3"
		}
		newClient := func(t *testing.T, opts ...idem.Option) *idem.Client {
			c, err := idem.NewWith(append([]idem.Option{idem.WithClock(clock.NewManual(epoch)), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}),
				idem.WithServer(idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"})}, opts...)...)
			require.NoError(t, err)
			return c
		}
		noSecret := func(t *testing.T, err error) {
			t.Helper()
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "SECRET")
			assert.Contains(t, err.Error(), "cart=42", "the rest of the URL stays, for the log to be of use")
		}

		t.Run("refused request", func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			for _, u := range []string{
				"https://sk_live_SECRET1:SECRET2@api.example:99999/payments?access_token=SECRET3",
				"ftp://sk_live_SECRET1:SECRET2@api.example/payments?access_token=SECRET3",
				"https://sk_live_SECRET1:SECRET2@api.example:port/payments?access_token=SECRET3",
				"//sk_live_SECRET1:SECRET2@api.example/payments?access_token=SECRET3",
				"https://sk_live_SECRET1:SECRET2@/payments?access_token=SECRET3",
			} {
				_, err := c.NewIntent(ctx, "checkout", idem.Request{Method: http.MethodPost, URL: u, Body: []byte(`{}`)})
				require.Error(t, err, u)
				assert.NotContains(t, err.Error(), "SECRET", u)
			}
		})
		t.Run("not sent", func(t *testing.T) {
			t.Parallel()
			refused := httptest.NewServer(http.NotFoundHandler())
			refused.Close() // nothing listens there now
			c := newClient(t)
			_, err := c.Send(ctx, "checkout", idem.Request{Method: http.MethodPost, URL: withSecrets(refused.URL), Body: []byte(`{}`)})
			require.ErrorIs(t, err, idem.ErrNotSent)
			noSecret(t, err)
		})
		t.Run("outcome unknown", func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close() // read, never answered
				}
			}))
			t.Cleanup(srv.Close)
			c := newClient(t)
			in, err := c.NewIntent(ctx, "checkout", idem.Request{Method: http.MethodPost, URL: withSecrets(srv.URL), Body: []byte(`{}`)})
			require.NoError(t, err)
			_, err = c.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			require.ErrorAs(t, err, new(*idem.RetryError))
			noSecret(t, err)

			// The lookup, at the intent's URL, fails alike.
			_, err = c.Reconcile(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			noSecret(t, err)
		})
		t.Run("redirect not followed", func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Location", "https://sk_live_SECRET1:SECRET2@login.example/?cart=42&session_token=SECRET3")
				w.WriteHeader(http.StatusFound)
			}))
			t.Cleanup(srv.Close)
			c := newClient(t)
			_, err := c.Send(ctx, "checkout", idem.Request{Method: http.MethodPost, URL: srv.URL + "/payments", Body: []byte(`{}`)})
			require.ErrorAs(t, err, new(*idem.RetryError))
			noSecret(t, err)
			assert.Contains(t, err.Error(), "login.example", "where it redirects, for the app to fix")
		})
		t.Run("final answer", func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(marking(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusPaymentRequired)
			})))
			t.Cleanup(srv.Close)
			c := newClient(t)
			_, err := c.Send(ctx, "checkout", idem.Request{Method: http.MethodPost, URL: withSecrets(srv.URL), Body: []byte(`{}`)})
			var apiErr *idem.APIError
			require.ErrorAs(t, err, &apiErr)
			assert.Equal(t, http.StatusPaymentRequired, apiErr.StatusCode)
			noSecret(t, err)
		})
	})
}
