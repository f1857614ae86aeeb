package idem

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAnswer keeps what an answer tells of the intent: only the server's
// word settles it, and what is kept of it is its own.
func TestAnswer(t *testing.T) {

	t.Run("every server error is an unknown outcome", func(t *testing.T) {
		t.Parallel()
		retry := map[int]bool{408: true, 409: true, 429: true}
		for code := 0; code < 1000; code++ {
			want := retry[code] || code >= 500 || code < 100
			assert.Equal(t, want, retryableStatus(code), "status %d", code)
			redirect := code >= 300 && code < 400
			assert.Equal(t, !want && !redirect, isFinal(code, http.Header{}, "k"), "status %d", code)
			// A marked redirect is final only as a 303: the work was done.
			assert.Equal(t, !redirect || code == http.StatusSeeOther, isFinal(code, http.Header{"Idempotent-Replayed": {"true"}, "Idempotency-Key": {"k"}}, "k"), "status %d replayed", code)
			// The replay header without the key's echo is no mark: a cache may
			// serve another intent's replay.
			assert.Equal(t, !redirect, isFinal(code, http.Header{"Idempotent-Replayed": {"true"}}, "k"), "status %d replayed without the echo", code)
		}

		// A CDN in front of the server answers its own 5xx (or a status no
		// server defines) after the server charged: the intent is not failed,
		// and the retry gets the server's stored answer.
		for _, code := range []int{501, 507, 520, 522, 524, 599, 600, 999, 42} {
			t.Run(strconv.Itoa(code), func(t *testing.T) {
				t.Parallel()
				clk := clock.NewManual(retryAfterNow)
				srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
				t.Cleanup(srv.Close)
				cdn := &statusAfterWork{base: srv.Client().Transport, status: code, times: 1}
				c, err := NewWith(WithHTTPClient(&http.Client{Transport: cdn}), WithClock(clk))
				require.NoError(t, err)
				in := newPayment(t, c, srv.URL)

				resp, err := c.Do(context.Background(), in)
				require.NoError(t, err)
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.True(t, resp.Replayed, "the second attempt got the stored answer")
				assert.Equal(t, 2, resp.Attempts)
				assert.Equal(t, 1, srv.Stats().ProviderCharges)

				// With no attempt left, the outcome is unknown, not failed.
				cdn.times = 1
				c1, err := NewWith(WithHTTPClient(&http.Client{Transport: cdn}), WithClock(clk), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}))
				require.NoError(t, err)
				in = newPayment(t, c1, srv.URL)
				_, err = c1.Do(context.Background(), in)
				require.ErrorIs(t, err, ErrOutcomeUnknown)
				assert.False(t, in.State().Resolved(), "a %d says nothing about the work", code)
			})
		}
	})

	t.Run("a replayed answer is final whatever its status", func(t *testing.T) {
		t.Parallel()
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusInternalServerError)
		}))
		t.Cleanup(srv.Close)
		c, err := NewWith(WithHTTPClient(srv.Client()), WithClock(clock.NewManual(retryAfterNow)))
		require.NoError(t, err)
		in := newPayment(t, c, srv.URL)

		resp, err := c.Do(context.Background(), in)
		var apiErr *APIError
		require.ErrorAs(t, err, &apiErr)
		assert.NotErrorIs(t, err, ErrOutcomeUnknown)
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		assert.True(t, resp.Replayed)
		assert.EqualValues(t, 1, requests.Load(), "the server's stored record is not asked for again")
		assert.True(t, in.State().Resolved())

		_, err = c.Do(context.Background(), in)
		require.ErrorAs(t, err, &apiErr)
		assert.EqualValues(t, 1, requests.Load(), "a later Do answers from the device")
	})

	// The header fields kept of an answer share one array, yet an append to one
	// field's values changes no other field, and a change to the answer's header
	// does not reach them.
	t.Run("the stored header fields keep their own values", func(t *testing.T) {
		cfg, err := newConfig(Config{Server: Server{Mark: MarkEcho, StoredHeaders: []string{"X-Request-Id"}}})
		require.NoError(t, err)
		h := http.Header{
			"Location":     {"/payments/1"},
			"Content-Type": {"application/json"},
			"X-Request-Id": {"r1", "r2"},
			"Set-Cookie":   {"s=1"},
		}
		got := cfg.storedHeader(h)
		require.Equal(t, http.Header{
			"Location":     {"/payments/1"},
			"Content-Type": {"application/json"},
			"X-Request-Id": {"r1", "r2"},
		}, got)
		// A change to the answer's header, made before any append could have
		// copied the kept values away from it, does not reach them.
		h["Location"][0] = "/payments/2"
		h["X-Request-Id"][1] = "r3"
		require.Equal(t, http.Header{
			"Location":     {"/payments/1"},
			"Content-Type": {"application/json"},
			"X-Request-Id": {"r1", "r2"},
		}, got)
		for name := range got {
			got[name] = append(got[name], "appended")
		}
		for name, vs := range got {
			assert.Equal(t, "appended", vs[len(vs)-1], name)
		}
		assert.Equal(t, []string{"/payments/1", "appended"}, got["Location"])
		assert.Equal(t, []string{"application/json", "appended"}, got["Content-Type"])
		assert.Equal(t, []string{"r1", "r2", "appended"}, got["X-Request-Id"])
	})
}
