package bench

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestRun checks every measurement at a tiny size: the counts and the
// report's shape, never a timing.
func TestRun(t *testing.T) {
	t.Run("every measurement runs at a tiny size", func(t *testing.T) {
		cfg := Config{
			Requests: 6, Concurrency: 2, Batch: 2, LayerRequests: 6,
			StormRequests: 20, StormDelay: 20 * time.Millisecond,
			Saves: 3, Intents: []int{5}, Dir: t.TempDir(),
		}
		rep, err := Run(context.Background(), cfg, nil)
		require.NoError(t, err)

		require.Len(t, rep.Clients.Results, 5)
		for _, r := range rep.Clients.Results {
			assert.Positive(t, r.Requests, r.Name)
			assert.Positive(t, r.P50, r.Name)
			assert.GreaterOrEqual(t, r.P99, r.P50, r.Name)
		}
		assert.Equal(t, 6, rep.Clients.Results[0].Requests)
		assert.GreaterOrEqual(t, rep.Clients.FileIntents, int64(rep.Clients.Results[3].Requests), "warm-up intents are counted too")
		assert.Equal(t, 1.0, rep.Clients.WritesPerIntent(), "a successful intent is saved durably when created")
		assert.Equal(t, 1.0, rep.Clients.DeferredPerIntent(), "and deferred when resolved")

		require.Len(t, rep.Layer, 3)
		require.Len(t, rep.LoopbackLayer, 3)
		assert.Equal(t, 1, rep.Storm.Executions)
		assert.Equal(t, 1, rep.Storm.Created)
		assert.Zero(t, rep.Storm.Other)
		assert.Equal(t, 19, rep.Storm.Replayed+rep.Storm.InProgress)
		assert.Equal(t, 3, rep.Saves.Saves)
		require.Len(t, rep.Open, 1)
		assert.Equal(t, 5, rep.Open[0].Intents)

		var out bytes.Buffer
		rep.Print(&out)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		assert.Regexp(t, `^ratio idem\(memory\)/net-http: \d+\.\d\d$`, lines[len(lines)-1])
	})

	t.Run("the PostgreSQL measurements run at a tiny size", func(t *testing.T) {
		cfg := PGConfig{Requests: 20, Concurrencies: []int{1, 4}, Batch: 5, StormRequests: 30, StormDelay: 50 * time.Millisecond}
		rep, err := RunPostgres(context.Background(), pgtest.DSN(t), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cfg.Concurrencies {
			rs := rep.ByConcurrency[c]
			if len(rs) != 5 {
				t.Fatalf("concurrency %d: %d variants, want 5", c, len(rs))
			}
			for _, r := range rs {
				if r.Requests != cfg.Requests || r.P50 <= 0 {
					t.Errorf("concurrency %d, %s: %d requests, p50 %v", c, r.Name, r.Requests, r.P50)
				}
			}
		}
		s := rep.Storm
		if s.Executions != 1 || s.Created != 1 || s.Created+s.Replayed+s.InProgress != cfg.StormRequests {
			t.Errorf("storm: %+v; want one execution, one fresh 201, the rest replays or 409s", s)
		}
		var out bytes.Buffer
		rep.Print(&out)
		if o := rep.OtherKeys; o == nil || o.Calm <= 0 || o.Storm <= 0 {
			t.Errorf("other keys: %+v; want a p50 calm and during the storm", o)
		}
		if !strings.Contains(out.String(), "one transaction, fresh key") || !strings.Contains(out.String(), "executions 1 (must be 1)") ||
			!regexp.MustCompile(`(?m)^ratio pg-fresh-1tx/bare: \d+\.\d\d$`).MatchString(out.String()) {
			t.Errorf("report:\n%s", out.String())
		}
	})
}

func TestPercentiles(t *testing.T) {
	lat := make([]time.Duration, 100)
	for i := range lat {
		lat[i] = time.Duration(100-i) * time.Millisecond
	}
	p50, p99 := percentiles(lat)
	assert.Equal(t, 50*time.Millisecond, p50)
	assert.Equal(t, 99*time.Millisecond, p99)
	p50, p99 = percentiles([]time.Duration{7})
	assert.Equal(t, time.Duration(7), p50)
	assert.Equal(t, time.Duration(7), p99)
}
