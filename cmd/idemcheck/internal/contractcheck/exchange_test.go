package contractcheck

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSend checks the bound on the requests the check sends.
func TestSend(t *testing.T) {
	// A request past the planned number is not sent.
	t.Run("a request past the planned number is not sent", func(t *testing.T) {
		var got atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got.Add(1)
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(srv.Close)
		cfg, err := Config{URL: srv.URL}.normalise()
		require.NoError(t, err)
		c := &checker{cfg: cfg, client: srv.Client(), budget: 1}

		assert.True(t, c.post(context.Background(), cfg.Body, "k1").ok())
		ex := c.post(context.Background(), cfg.Body, "k2")
		assert.ErrorIs(t, ex.err, errBudget)
		assert.Equal(t, int64(1), got.Load())
		assert.Equal(t, int64(1), c.sent.Load())
	})
}
