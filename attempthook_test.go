package idem_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// The attempt hook hears each attempt's action name, URL (its password
// redacted) and duration, measured on the Client's clock: a server that
// takes 250ms on the manual clock makes attempts of exactly 250ms, and the
// wait after one is not part of it.
func TestAttemptHookReportsNameURLAndDuration(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(epoch)
	srv := &server{answer: func(n int, req *http.Request) (*http.Response, error) {
		clk.Advance(250 * time.Millisecond)
		if n == 1 {
			return unavailable(n, req)
		}
		return created(n, req)
	}}
	var (
		mu       sync.Mutex
		attempts []idem.Attempt
	)
	c := budgetClient(t, srv, clk, persist.NewMemory(nil), idem.WithAttemptHook(func(a idem.Attempt) {
		mu.Lock()
		defer mu.Unlock()
		a.Err = nil
		attempts = append(attempts, a)
	}))
	req := idem.Request{Method: http.MethodPost, URL: "https://shop:s3cret@api.example/payments?cart=42", Body: []byte(`{}`)}
	resp, err := c.Send(context.Background(), "checkout:cart-42", req)
	require.NoError(t, err)
	require.Equal(t, 2, resp.Attempts)
	key := attempts[0].Key
	redacted := "https://shop:xxxxx@api.example/payments?cart=42"
	assert.Equal(t, []idem.Attempt{
		{Key: key, Number: 1, StatusCode: 503, Retry: true, Wait: 500 * time.Millisecond, Name: "checkout:cart-42", URL: redacted, Duration: 250 * time.Millisecond},
		{Key: key, Number: 2, StatusCode: 201, Name: "checkout:cart-42", URL: redacted, Duration: 250 * time.Millisecond},
	}, attempts)

	// A request of the RoundTripper without an intent has no name.
	attempts = nil
	hreq, err := http.NewRequest(http.MethodPost, "https://api.example/refunds", http.NoBody)
	require.NoError(t, err)
	hresp, err := (&http.Client{Transport: c.RoundTripper(srv)}).Do(hreq)
	require.NoError(t, err)
	hresp.Body.Close()
	require.Len(t, attempts, 1)
	assert.Equal(t, "", attempts[0].Name)
	assert.Equal(t, "https://api.example/refunds", attempts[0].URL)
	assert.Equal(t, 250*time.Millisecond, attempts[0].Duration)
}
