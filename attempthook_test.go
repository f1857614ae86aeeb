package idem_test

import (
	"context"
	"net/http"
	"net/url"
	"sync"
	"syscall"
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

// The attempt hook's URL, meant for logs, carries no credential: not a
// secret key sent as the user name with an empty password (Stripe's
// "sk_live_...:"), not a token sent as the user name alone, not a query
// parameter named for a credential (access_token, api_key, an AWS
// presigned URL's signature and security token), nor a fragment. The
// other query parameters stay, for the log to be of use.
func TestAttemptHookURLCarriesNoCredential(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"https://sk_live_51Habc:@api.example/v1/charges", "https://xxxxx@api.example/v1/charges"},
		{"https://ghp_16C7e42F292c6912E7710c83@api.example/repos", "https://xxxxx@api.example/repos"},
		{"https://shop:s3cret@api.example/payments", "https://shop:xxxxx@api.example/payments"},
		{"https://api.example/payments?cart=42&access_token=eyJhbGciOi&api_key=AIzaSy",
			"https://api.example/payments?cart=42&access_token=xxxxx&api_key=xxxxx"},
		{"https://bucket.example/o?X-Amz-Credential=AKIA%2F20261203&X-Amz-Signature=9f0e&X-Amz-Security-Token=FQoG&X-Amz-Expires=60",
			"https://bucket.example/o?X-Amz-Credential=xxxxx&X-Amz-Signature=xxxxx&X-Amz-Security-Token=xxxxx&X-Amz-Expires=60"},
		{"https://api.example/pay?sig=abc&key=AIza&Password=hunter2", "https://api.example/pay?sig=xxxxx&key=xxxxx&Password=xxxxx"},
		{"https://api.example/pay?cart=42#access_token=eyJhbGciOi", "https://api.example/pay?cart=42"},
		{"https://api.example/pay?cart=42&pass_word=hunter2", "https://api.example/pay?cart=42&pass_word=xxxxx"},
	} {
		var (
			mu  sync.Mutex
			got []string
		)
		srv := &server{answer: created}
		c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil), idem.WithAttemptHook(func(a idem.Attempt) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, a.URL)
		}))
		_, err := c.Send(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: tc.url, Body: []byte(`{}`)})
		require.NoError(t, err, tc.url)
		assert.Equal(t, []string{tc.want}, got, tc.url)
	}
}

// The attempt's error carries no credential either: net/http's *url.Error
// names the request's URL, with only a password starred, so the hook's
// Err would show what its URL hides. It stays the same error to
// errors.Is and errors.As.
func TestAttemptHookErrorCarriesNoCredential(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"https://sk_live_51Habc:@api.example/v1/charges?cart=42",
		"https://ghp_16C7e42F292c6912E7710c83@api.example/repos",
		"https://api.example/payments?access_token=eyJhbGciOi",
	} {
		var (
			mu   sync.Mutex
			errs []error
		)
		srv := &server{answer: refused}
		c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2, Jitter: -1}),
			idem.WithAttemptHook(func(a idem.Attempt) {
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, a.Err)
			}))
		_, err := c.Send(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: raw, Body: []byte(`{}`)})
		require.Error(t, err)
		require.Len(t, errs, 2, raw)
		for _, e := range errs {
			require.Error(t, e, raw)
			for _, secret := range []string{"sk_live_51Habc", "ghp_16C7e42F292c6912E7710c83", "eyJhbGciOi"} {
				assert.NotContains(t, e.Error(), secret)
			}
			assert.Contains(t, e.Error(), "api.example/")
			assert.ErrorIs(t, e, syscall.ECONNREFUSED)
			var ue *url.Error
			assert.ErrorAs(t, e, &ue)
		}
	}
}
