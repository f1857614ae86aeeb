package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

func TestOnlyAnAnswerThatSaysSoIsKeyReuse(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		status      int
		contentType string
		body        string
		reused      bool
	}{
		{"contract problem", 422, "application/problem+json", `{"type":"https://idem.dev/problems/idempotency-key-reused","status":422}`, true},
		{"stripe", 400, "application/json", `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}`, true},
		{"app's own server", 422, "application/json", `{"code":"DUPLICATE_KEY"}`, true},
		{"validation 422", 422, "application/json", `{"errors":{"amount":["must be positive"]}}`, false},
		{"validation problem", 422, "application/problem+json", `{"type":"https://example.com/problems/validation","status":422}`, false},
		{"bare 422", 422, "text/plain", `Unprocessable`, false},
		{"stripe card error", 402, "application/json", `{"error":{"type":"card_error"}}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			t.Cleanup(srv.Close)
			c, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)),
				idem.WithServer(idem.Server{KeyReusedAnswer: func(resp *idem.Response) bool {
					return strings.Contains(string(resp.Body), "DUPLICATE_KEY")
				}}))
			require.NoError(t, err)
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1})
			require.NoError(t, err)
			in, err := c.NewIntent(context.Background(), "", req)
			require.NoError(t, err)

			resp, err := c.Do(context.Background(), in)
			var apiErr *idem.APIError
			require.ErrorAs(t, err, &apiErr, "a final answer")
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Equal(t, tc.reused, errors.Is(err, idem.ErrKeyReused))
			if tc.reused {
				assert.Equal(t, persist.StateRejected, in.State())
			} else {
				assert.Equal(t, persist.StateFailed, in.State())
			}
			// The stored answer says the same.
			_, err = c.Do(context.Background(), in)
			assert.Equal(t, tc.reused, errors.Is(err, idem.ErrKeyReused), "from the store")
		})
	}
}
