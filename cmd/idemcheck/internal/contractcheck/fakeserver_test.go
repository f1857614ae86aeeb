package contractcheck_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/cmd/idemcheck/internal/contractcheck"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/pgfake"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestRun checks the check's verdicts on servers that keep the contract
// and on servers that break one rule each.
func TestRun(t *testing.T) {
	// The fake server keeps the whole contract, in either key format, so
	// every row passes, the fault rows included, and the check sends no more
	// requests than it announced. The lease is waited for on the server's
	// manual clock.
	t.Run("the fake server passes every row", func(t *testing.T) {
		for _, uuid := range []bool{false, true} {
			t.Run(map[bool]string{false: "any", true: "uuid"}[uuid], func(t *testing.T) {
				t.Parallel()
				clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
				srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk, RequireUUID: uuid})
				t.Cleanup(srv.Close)
				cfg := contractcheck.Config{
					URL:    srv.URL + "/payments",
					Auth:   "Bearer caller-1",
					Auth2:  "Bearer caller-2",
					Lookup: srv.URL + "/payments?idempotency_key={key}",
					Sleep:  clk.Sleep,
				}
				var progressed []string
				rep, err := contractcheck.Run(context.Background(), cfg, func(r contractcheck.Row) { progressed = append(progressed, r.ID) })
				require.NoError(t, err)
				require.Len(t, rep.Rows, len(contractcheck.Rows()))
				for i, r := range rep.Rows {
					assert.Equal(t, contractcheck.Rows()[i].ID, r.ID)
					assert.Equal(t, contractcheck.Pass, r.Status, "%s: %s %v", r.ID, r.Detail, r.Evidence)
				}
				assert.Len(t, progressed, len(rep.Rows), "every row is reported as it is judged")
				assert.True(t, rep.OK())
				planned, _, err := contractcheck.Plan(cfg)
				require.NoError(t, err)
				assert.Equal(t, planned, rep.Planned)
				assert.LessOrEqual(t, rep.Sent, rep.Planned)
				// 1s, 2s, 4s, 8s and 16s of backoff outlast the 30s lease.
				assert.Equal(t, []time.Duration{1, 2, 4, 8, 16}, secondsOf(clk.Sleeps()))
			})
		}
	})

	// A lease longer than -lease-wait cannot be waited out: the dead-worker
	// row is SKIP, not FAIL, and the waits stop at LeaseWait.
	t.Run("a lease too long to wait out is a skip", func(t *testing.T) {
		clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk, Lease: time.Hour})
		t.Cleanup(srv.Close)
		rep, err := contractcheck.Run(context.Background(), contractcheck.Config{
			URL: srv.URL + "/payments", LeaseWait: time.Minute, Sleep: clk.Sleep}, nil)
		require.NoError(t, err)
		for _, r := range rep.Rows {
			if r.ID == "dead-worker" {
				assert.Equal(t, contractcheck.Skip, r.Status)
				assert.Equal(t, "the lease did not end within -lease-wait 1m0s; give a longer one", r.Detail)
			}
		}
		assert.Equal(t, []time.Duration{1, 2, 4, 8, 16, 29}, secondsOf(clk.Sleeps()))
		assert.Zero(t, rep.Fail)
	})

	// With its state in PostgreSQL the fake server keeps the whole contract
	// too; every row passes, the dead worker's row waited out on the
	// server's manual clock.
	t.Run("the fake server on PostgreSQL passes every row", func(t *testing.T) {
		pool, err := pgxpool.New(context.Background(), pgtest.DSN(t))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		require.NoError(t, pgfake.Migrate(context.Background(), pool))

		clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk, Storage: pgfake.New(context.Background(), pool)})
		t.Cleanup(srv.Close)
		rep, err := contractcheck.Run(context.Background(), contractcheck.Config{
			URL:    srv.URL + "/payments",
			Auth:   "Bearer caller-1",
			Auth2:  "Bearer caller-2",
			Lookup: srv.URL + "/payments?idempotency_key={key}",
			Sleep:  clk.Sleep,
		}, nil)
		require.NoError(t, err)
		require.Len(t, rep.Rows, len(contractcheck.Rows()))
		for _, r := range rep.Rows {
			assert.Equal(t, contractcheck.Pass, r.Status, "%s: %s %v", r.ID, r.Detail, r.Evidence)
		}
		assert.True(t, rep.OK())
	})

	// Each server breaks one rule of the contract, and the check fails
	// exactly the rows that rule decides, passing every other.
	t.Run("a broken server fails exactly the rows of its rule", func(t *testing.T) {
		tests := []struct {
			name  string
			knobs labKnobs
			fails []string
			// skips are rows that cannot judge their rule on this server,
			// because the broken rule comes first.
			skips []string
		}{
			{name: "keeps the contract"},
			{name: "key optional", fails: []string{"key-missing"}, knobs: labKnobs{wrap: keyOptional}},
			{name: "accepts malformed keys", fails: []string{"key-empty", "key-too-long", "key-control-char", "key-twice"},
				knobs: labKnobs{wrap: acceptsMalformedKeys}},
			{name: "look-up-then-insert race", knobs: labKnobs{store: newRacyStore}, fails: []string{"concurrent"}},
			{name: "no fingerprint check", fails: []string{"changed-body"},
				knobs: labKnobs{store: func(_ *labServer, s *idempotency.MemoryStore) idempotency.Store { return blindStore{s} }}},
			{name: "stores a 5xx", fails: []string{"5xx-not-stored"},
				knobs: labKnobs{store: func(_ *labServer, s *idempotency.MemoryStore) idempotency.Store { return errorStoringStore{s} }}},
			{name: "no scoping", fails: []string{"scoping"},
				knobs: labKnobs{principal: func(*http.Request) string { return "" }}},
			{name: "409 without Retry-After", fails: []string{"concurrent"},
				knobs: labKnobs{wrap: editAnswers(func(status int, h http.Header) {
					if status == http.StatusConflict {
						h.Del("Retry-After")
					}
				})}},
			{name: "quoted and bare as two keys", fails: []string{"quoted-bare"}, knobs: labKnobs{wrap: quotesInKey}},
			{name: "replay without the marker", fails: []string{"replay"},
				knobs: labKnobs{wrap: editAnswers(func(_ int, h http.Header) { h.Del("Idempotent-Replayed") })}},
			{name: "replay without its Content-Type", fails: []string{"replay"},
				knobs: labKnobs{wrap: editAnswers(func(_ int, h http.Header) {
					if h.Get("Idempotent-Replayed") != "" {
						h.Del("Content-Type")
					}
				})}},
			{name: "stores a validation failure", fails: []string{"validation-key-free"}, knobs: labKnobs{validateInHandler: true}},
			{name: "fingerprints the bytes", fails: []string{"reserialised-json"},
				knobs: labKnobs{store: func(_ *labServer, s *idempotency.MemoryStore) idempotency.Store { return byteStore{s} }}},
			{name: "lookup ignores the key", fails: []string{"lookup"}, skips: []string{"lookup-miss"}, knobs: labKnobs{lookupIgnoresKey: true}},
			{name: "charges again on takeover", fails: []string{"dead-worker"}, knobs: labKnobs{chargeOnTakeover: true}},
			{name: "answers without the key echo", fails: []string{"key-echo"},
				knobs: labKnobs{wrap: editAnswers(func(_ int, h http.Header) { h.Del("Idempotency-Key") })}},
			{name: "echoes a refusal's key parsed, not as received", fails: []string{"key-echo"},
				knobs: labKnobs{wrap: editAnswers(func(status int, h http.Header) {
					if k, err := idempotency.ParseKey(h.Get("Idempotency-Key")); status >= 400 && err == nil {
						h.Set("Idempotency-Key", k)
					}
				})}},
			{name: "lookup answers without no-store", fails: []string{"key-echo"},
				knobs: labKnobs{wrap: editAnswers(func(_ int, h http.Header) { h.Del("Cache-Control") })}},
			{name: "lookup misses with a plain 404", fails: []string{"lookup-miss"}, knobs: labKnobs{untypedMiss: true}},
			{name: "marks a fresh answer replayed", fails: []string{"fresh-not-replayed"},
				knobs: labKnobs{wrap: editAnswers(func(status int, h http.Header) {
					if status == http.StatusCreated {
						h.Set("Idempotent-Replayed", "true")
					}
				})}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
				url := startLab(t, clk, tt.knobs)
				rep, err := contractcheck.Run(context.Background(), contractcheck.Config{
					URL: url + "/payments", Auth: "Bearer caller-1", Auth2: "Bearer caller-2",
					Lookup:      url + "/payments?idempotency_key={key}",
					Concurrency: labConcurrency, Sleep: clk.Sleep,
				}, nil)
				require.NoError(t, err)

				want := map[string]contractcheck.Status{}
				for _, r := range contractcheck.Rows() {
					want[r.ID] = contractcheck.Pass
				}
				for _, id := range tt.fails {
					want[id] = contractcheck.Fail
				}
				for _, id := range tt.skips {
					want[id] = contractcheck.Skip
				}
				got := map[string]contractcheck.Status{}
				for _, r := range rep.Rows {
					got[r.ID] = r.Status
					if r.Status != want[r.ID] {
						t.Logf("%s %s: %s", r.Status, r.ID, r.Detail)
						for _, e := range r.Evidence {
							t.Logf("  -> %s\n  <- %s", e.Request, e.Response)
						}
					}
				}
				assert.Equal(t, want, got)
				assert.Equal(t, len(tt.fails), rep.Fail)
				assert.LessOrEqual(t, rep.Sent, rep.Planned)
			})
		}
	})
}

func secondsOf(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Second
	}
	return out
}
