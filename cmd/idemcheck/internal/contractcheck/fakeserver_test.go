package contractcheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/cmd/idemcheck/internal/contractcheck"
	"github.com/idemkit/idem/fakeserver"
)

// TestRunFakeServer: the fake server keeps the whole contract, in either
// key format, so every row passes, the fault rows included, and the check
// sends no more requests than it announced. The lease is waited for on the
// server's manual clock.
func TestRunFakeServer(t *testing.T) {
	for _, format := range []fakeserver.KeyFormat{fakeserver.KeyFormatAny, fakeserver.KeyFormatUUID} {
		t.Run(string(format), func(t *testing.T) {
			t.Parallel()
			clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk, KeyFormat: format})
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
}

// TestRunFakeServerLongLease: a lease longer than -lease-wait cannot be
// waited out: the dead-worker row is SKIP, not FAIL, and the waits stop at
// LeaseWait.
func TestRunFakeServerLongLease(t *testing.T) {
	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk, Lease: time.Hour})
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
}

func secondsOf(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Second
	}
	return out
}
