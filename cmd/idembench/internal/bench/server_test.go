package bench

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/fakeserver"
)

// TestBareHandler checks the baseline of the layer's cost.
func TestBareHandler(t *testing.T) {
	// A repeated key included.
	t.Run("does the work on every request", func(t *testing.T) {
		t.Parallel()
		h := fakeserver.NewBareHandler(nil)
		for range 2 {
			req := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(paymentBody))
			req.Header.Set("Idempotency-Key", "same")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, http.StatusCreated, rec.Code)
			assert.Empty(t, rec.Header().Get("Idempotent-Replayed"))
		}
		assert.Equal(t, 2, h.Stats().Executions)
		assert.Equal(t, 2, h.Stats().Payments)
	})
}
