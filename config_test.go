package idem_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// Every field of Config out of range makes New fail with an error that
// names the field, the value and what to give instead.
func TestNewRefusesConfigOutOfRange(t *testing.T) {
	t.Parallel()
	var nilDir *persist.FileStore
	for _, tc := range []struct {
		name string
		cfg  idem.Config
		want []string // each must occur in the error
	}{
		{"max attempts", idem.Config{RetryPolicy: idem.RetryPolicy{MaxAttempts: -1}}, []string{"Config.RetryPolicy.MaxAttempts is -1", "MaxAttempts is -1", "0 for the default (10)"}},
		{"jitter above 1", idem.Config{RetryPolicy: idem.RetryPolicy{Jitter: 5}}, []string{"Jitter is 5", "at most 1", "-1 for none"}},
		{"jitter negative", idem.Config{RetryPolicy: idem.RetryPolicy{Jitter: -0.5}}, []string{"Jitter is -0.5"}},
		{"jitter NaN", idem.Config{RetryPolicy: idem.RetryPolicy{Jitter: math.NaN()}}, []string{"Jitter is NaN"}},
		{"max elapsed", idem.Config{RetryPolicy: idem.RetryPolicy{MaxElapsed: -time.Second}}, []string{"MaxElapsed is -1s", "0 for the default (2m)"}},
		{"initial interval", idem.Config{RetryPolicy: idem.RetryPolicy{InitialInterval: -time.Millisecond}}, []string{"InitialInterval is -1ms"}},
		{"max interval", idem.Config{RetryPolicy: idem.RetryPolicy{MaxInterval: -time.Second}}, []string{"MaxInterval is -1s"}},
		{"max interval below initial", idem.Config{RetryPolicy: idem.RetryPolicy{InitialInterval: 2 * time.Second, MaxInterval: time.Second}}, []string{"MaxInterval is 1s", "below InitialInterval (2s)"}},
		{"max retry after", idem.Config{RetryPolicy: idem.RetryPolicy{MaxRetryAfter: -time.Second}}, []string{"MaxRetryAfter is -1s"}},
		{"multiplier negative", idem.Config{RetryPolicy: idem.RetryPolicy{Multiplier: -2}}, []string{"Multiplier is -2", "1 (the same wait each time) or more"}},
		{"multiplier shrinks", idem.Config{RetryPolicy: idem.RetryPolicy{Multiplier: 0.5}}, []string{"Multiplier is 0.5"}},
		{"multiplier infinite", idem.Config{RetryPolicy: idem.RetryPolicy{Multiplier: math.Inf(1)}}, []string{"Multiplier is +Inf"}},
		{"nil clock pointer", idem.Config{Clock: (*clock.Manual)(nil)}, []string{"Config.Clock is a nil *clock.Manual"}},
		{"nil store pointer", idem.Config{Store: nilDir}, []string{"Config.Store is a nil *persist.FileStore", "persist.OpenDir"}},
		{"negative reconcile delay", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, ReconcileDelay: -time.Minute}}, []string{"Server.ReconcileDelay is -1m0s", "0 for the default (2m0s)"}},
		{"negative response size", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, MaxResponseBytes: -1}}, []string{"Server.MaxResponseBytes is -1"}},
		{"retention", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, Retention: time.Hour, RetentionMargin: 2 * time.Hour}}, []string{"retention 1h0m0s with margin 2h0m0s"}},
		{"set-cookie", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"Location", "set-cookie"}}}, []string{`Server.StoredHeaders holds "Set-Cookie"`, "credentials", "never written to the device"}},
		{"authorization", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"Authorization"}}}, []string{`"Authorization"`, "credentials"}},
		{"token", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"X-Auth-Token"}}}, []string{`"X-Auth-Token"`}},
		{"session", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"X-Session-Id"}}}, []string{`"X-Session-Id"`}},
		{"not a field name", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"Content Type"}}}, []string{`"Content Type"`, "not a header field name"}},
		{"empty field name", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{""}}}, []string{`Server.StoredHeaders holds ""`}},
		{"lookup twice", idem.Config{Server: idem.Server{Mark: idem.MarkEcho, Lookup: func(idem.Request, string) string { return "" }, LookupQuery: "k"}}, []string{"Server.Lookup and Server.LookupQuery are both set"}},
		{"no mark", idem.Config{}, []string{"Config.Server.Mark is not set", "idem.MarkEcho", "idem.MarkStripe", "idem.MarkAdyen", "idem.MarkIncrease", "idem.MarkJSONID", "idem.MarkRecognizer", "never settles an intent"}},
		{"mark of an empty id path", idem.Config{Server: idem.Server{Mark: idem.MarkJSONID("")}}, []string{`Config.Server.Mark is idem.MarkJSONID("")`, "\"data.id\""}},
		{"mark of an id path with an empty segment", idem.Config{Server: idem.Server{Mark: idem.MarkJSONID("data..id")}}, []string{`idem.MarkJSONID("data..id")`, "empty segment"}},
		{"nil recognizer", idem.Config{Server: idem.Server{Mark: idem.MarkRecognizer(nil)}}, []string{"Config.Server.Mark is idem.MarkRecognizer(...)", "recognizer is nil"}},
		{"settle concurrency", idem.Config{SettleConcurrency: -1}, []string{"Config.SettleConcurrency is -1", "1 or more"}},
		{"budget tokens", idem.Config{RetryBudget: idem.RetryBudget{Tokens: -2}}, []string{"RetryBudget.Tokens is -2", "-1 for no budget"}},
		{"budget below a retry", idem.Config{RetryBudget: idem.RetryBudget{Tokens: 4}}, []string{"RetryBudget.Tokens is 4", "below a retry's cost"}},
		{"budget retry cost", idem.Config{RetryBudget: idem.RetryBudget{RetryCost: -1}}, []string{"RetryBudget.RetryCost is -1"}},
		{"budget timeout cost", idem.Config{RetryBudget: idem.RetryBudget{TimeoutCost: -3}}, []string{"RetryBudget.TimeoutCost is -3"}},
		{"budget refill", idem.Config{RetryBudget: idem.RetryBudget{Refill: -time.Second}}, []string{"RetryBudget.Refill is -1s", "-1 for none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := idem.New(tc.cfg)
			require.Error(t, err)
			assert.Nil(t, c)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Contains(t, err.Error(), "idem: ")
		})
	}
}

// New reports every field out of range at once, not only the first.
func TestNewReportsEveryFieldOutOfRange(t *testing.T) {
	t.Parallel()
	var nilDir *persist.FileStore
	_, err := idem.New(idem.Config{
		Store:       nilDir,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: -1, Jitter: 2},
		Server:      idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"Cookie"}, Retention: 30 * time.Minute},
	})
	require.Error(t, err)
	for _, w := range []string{"Config.Store is a nil", "MaxAttempts is -1", "Jitter is 2", `"Cookie"`, "retention 30m0s with margin 1h0m0s"} {
		assert.Contains(t, err.Error(), w)
	}
}

// The values at the edges of each range, and the Config with only its
// server's mark, are accepted.
func TestNewAcceptsConfigInRange(t *testing.T) {
	t.Parallel()
	_, err := idem.New(idem.Config{
		RetryPolicy:       idem.RetryPolicy{MaxAttempts: 1, Jitter: 1, Multiplier: 1, InitialInterval: time.Second, MaxInterval: time.Second},
		Server:            idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"X-Request-Id", "ETag"}},
		SettleConcurrency: 1,
		RetryBudget:       idem.RetryBudget{Tokens: 10, RetryCost: 10, TimeoutCost: 1, Refill: -1},
	})
	require.NoError(t, err)
	_, err = idem.New(idem.Config{Server: idem.Server{Mark: idem.MarkEcho}, RetryPolicy: idem.RetryPolicy{Jitter: -1}, RetryBudget: idem.RetryBudget{Tokens: -1}})
	require.NoError(t, err)
	_, err = idem.New(idem.Config{Server: idem.Server{Mark: idem.MarkEcho}})
	require.NoError(t, err)
}

// A policy out of range given for a call fails each call made with it at
// once, naming the field, before the intent is armed or anything sent: it
// never runs under defaults the app did not ask for.
func TestContextWithRetryPolicyOutOfRangeFailsTheCall(t *testing.T) {
	t.Parallel()
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	store := persist.NewMemory(nil)
	c, err := idem.NewWith(idem.WithStore(store), idem.WithClock(clock.NewManual(epoch)),
		idem.WithLookup(idem.LookupQuery("idempotency_key")))
	require.NoError(t, err)
	req := idem.Request{Method: http.MethodPost, URL: srv.URL + "/payments", Body: []byte(`{}`)}

	bad := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{Jitter: 5, MaxAttempts: -1})
	want := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "ContextWithRetryPolicy: RetryPolicy.Jitter is 5")
		assert.Contains(t, err.Error(), "MaxAttempts is -1")
	}
	_, err = c.Send(bad, "checkout:bad-policy", req)
	want(t, err)
	in, err := c.Intent(context.Background(), "checkout:bad-policy", req)
	require.NoError(t, err)
	_, err = c.Do(bad, in)
	want(t, err)
	_, err = c.Settle(bad, in)
	want(t, err)
	_, err = c.SettleAll(bad)
	want(t, err)
	_, err = c.Reconcile(bad, in)
	want(t, err)
	hr, err := http.NewRequestWithContext(bad, http.MethodPost, srv.URL+"/payments", nil)
	require.NoError(t, err)
	_, err = (&http.Client{Transport: c.RoundTripper(nil)}).Do(hr)
	want(t, err)

	assert.Zero(t, requests.Load(), "nothing was sent")
	recs, err := store.List(context.Background(), persist.Filter{})
	require.NoError(t, err)
	assert.Empty(t, recs, "nothing was armed")

	// The same call under a policy in range goes through.
	good := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 2, Jitter: -1})
	resp, err := c.Do(good, in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
}

// Server.StoredHeaders refuses the answer's fields that carry a token under
// another name than the common ones: a JSON Web Token or an assertion
// from an identity-aware proxy (Google IAP's X-Goog-Iap-Jwt-Assertion, an
// AWS load balancer's X-Amzn-Oidc-Data), a bearer token, an access or
// private key. Fields that only look alike stay allowed.
func TestServerStoredHeadersRefusesTokensUnderOtherNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"X-Goog-Iap-Jwt-Assertion", "X-Amzn-Oidc-Data", "X-Bearer", "X-Access-Key", "X-Private-Key", "X-Saml-Assertion"} {
		_, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{name}}))
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "credentials", name)
	}
	_, err := idem.NewWith(idem.WithServer(idem.Server{Mark: idem.MarkEcho, StoredHeaders: []string{"X-Request-Id", "ETag", "Location", "X-Keyboard-Layout", "X-Payment-Intent"}}))
	assert.NoError(t, err)
}
