package mobile

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Config names how the server marks its answers: Open refuses one
// without a mark, or with a mark that is no choice, in the facade's own
// words, and a plain server declared "json-id" is paid while a captive
// portal in front of it is not.
func TestConfigMark(t *testing.T) {
	t.Parallel()
	t.Run("Open refuses a Config without a mark and names the choices", func(t *testing.T) {
		t.Parallel()
		for _, mark := range []string{"", "Echo", "json"} {
			cfg := NewConfig(stateDir(t), "https://api.example.com")
			cfg.Mark = mark
			_, err := Open(cfg)
			require.Error(t, err, "%q", mark)
			assert.Equal(t, kindConfig, ErrorKind(err))
			for _, w := range []string{"Mark", `"echo"`, `"stripe"`, `"adyen"`, `"increase"`, `"json-id"`, "never settles a payment"} {
				assert.Contains(t, err.Error(), w, "%q", mark)
			}
		}
	})
	t.Run("Open refuses an id path with an empty segment", func(t *testing.T) {
		t.Parallel()
		cfg := NewConfig(stateDir(t), "https://api.example.com")
		cfg.Mark, cfg.MarkIDPath = "json-id", "data."
		_, err := Open(cfg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `MarkIDPath "data."`)
	})

	// A plain server: it keeps its payments by key but echoes nothing.
	// portal, when set, answers in its place.
	plain := func(t *testing.T, portal bool) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if portal {
				w.Header().Set("Content-Type", "text/html")
				_, _ = io.WriteString(w, "<html><body>Accept the terms to use the Wi-Fi</body></html>")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"data":{"id":"pay_1","amount":1500}}`)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	for _, tc := range []struct {
		name   string
		portal bool
		want   string
	}{
		{"a plain server's answer carrying the id is paid", false, OutcomeSucceeded},
		{"a captive portal's page in front of it is not", true, OutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := NewConfig(stateDir(t), plain(t, tc.portal))
			cfg.Mark, cfg.MarkIDPath, cfg.MaxAttempts = "json-id", "data.id", 1
			c, err := Open(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			res, err := c.Pay("checkout:cart-1", "/payments", []byte(cart), nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, res.Outcome)
		})
	}
}
