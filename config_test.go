package idem_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// TestNew keeps what New accepts: every field in range, and every field
// out of range named at once with what to give instead.
func TestNew(t *testing.T) {
	t.Parallel()

	// Every field of Config out of range makes New fail with an error that
	// names the field, the value and what to give instead.
	t.Run("it refuses each field out of range, naming it", func(t *testing.T) {
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
	})

	// New reports every field out of range at once, not only the first.
	t.Run("it reports every field out of range at once", func(t *testing.T) {
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
	})

	// The values at the edges of each range, and the Config with only its
	// server's mark, are accepted.
	t.Run("it accepts the edges of each range", func(t *testing.T) {
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
	})

	t.Run("it refuses a retention that leaves no time to send", func(t *testing.T) {
		t.Parallel()
		_, err := idem.NewWith(idem.WithRetention(time.Hour, time.Hour))
		require.Error(t, err)
		_, err = idem.NewWith(idem.WithRetention(2*time.Hour, time.Hour))
		require.NoError(t, err)
	})
}
