package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtest"
)

// sweepTableRows is how many rows the plan tests give a table: enough
// that reading all of them costs the planner far more than walking an
// index for one batch.
const sweepTableRows = 50_000

// TestSweepWalksTheExpiresAtIndex: the sweep's batch statement reads the
// records through the expires_at index, and nowhere reads the whole
// table, on a table of live records with a few expired among them, after
// ANALYZE. It holds for the plan made for the batch's values and for the
// generic plan that a prepared statement may switch to after five runs.
func TestSweepWalksTheExpiresAtIndex(t *testing.T) {
	for _, tc := range []struct {
		name    string
		expired int // records in a hundred that have expired
	}{
		{"a few expired records among live ones", 1},
		{"a sweep that fell behind: most records expired", 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t)
			ctx := context.Background()
			// The expired records expired an hour ago, the others live a
			// day; the two kinds alternate in the table's pages.
			_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO idempotency_records
				(caller, key, fingerprint, fingerprint_version, status, stable_id, created_at, expires_at)
				SELECT 'c' || (i %% 97), 'k' || i, decode(repeat('00', 32), 'hex'), 2, 'COMPLETED', 's' || i, now() - interval '1 day',
					now() + CASE WHEN i %% 100 < %d THEN interval '-1 hour' ELSE interval '1 day' END
				FROM generate_series(1, %d) AS i`, tc.expired, sweepTableRows))
			require.NoError(t, err)
			_, err = pool.Exec(ctx, "ANALYZE idempotency_records")
			require.NoError(t, err)

			for _, plan := range plansOf(t, pool, sweepSQL, "timestamptz, timestamptz, integer", "NULL, NULL, 1000") {
				t.Run("the "+plan.mode+" plan walks the index", func(t *testing.T) {
					plan.readsOnly(t, "idempotency_records", "idempotency_records_expires_at")
				})
			}
		})
	}
}

// plan is a statement's plan as EXPLAIN (FORMAT JSON) shows it.
type plan struct {
	mode  string // custom or generic
	nodes []planNode
	text  string
}

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Plans    []planNode `json:"Plans"`
}

// readsOnly checks that the plan reads relation in two ways only: one walk
// of index, in its order (no Sort anywhere), and fetches of rows by their
// address (a TID scan), never the whole table or another index.
func (p plan) readsOnly(t *testing.T, relation, index string) {
	t.Helper()
	walks := 0
	for _, n := range p.nodes {
		switch {
		case n.Type == "Sort":
			t.Errorf("a sort (the index gives its rows in order):\n%s", p.text)
		case n.Relation != relation || n.Type == "Tid Scan" || n.Type == "ModifyTable":
		case (n.Type == "Index Scan" || n.Type == "Index Only Scan") && n.Index == index:
			walks++
		default:
			t.Errorf("%s of %s %s:\n%s", n.Type, relation, n.Index, p.text)
		}
	}
	if walks != 1 {
		t.Errorf("%d walks of %s, want one:\n%s", walks, index, p.text)
	}
}

// plansOf prepares sql with the parameter types params and explains its
// execution with the values args, in the plan made for those values
// ("custom") and in the generic plan.
func plansOf(t *testing.T, pool *pgxpool.Pool, sql, params, args string) []plan {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "PREPARE sweep_plan ("+params+") AS "+sql)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE sweep_plan") }()
	var out []plan
	for _, mode := range []string{"custom", "generic"} {
		_, err := conn.Exec(ctx, "SET plan_cache_mode = force_"+mode+"_plan")
		require.NoError(t, err)
		var raw string
		require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE sweep_plan ("+args+")").Scan(&raw))
		var top []struct {
			Plan planNode `json:"Plan"`
		}
		require.NoError(t, json.Unmarshal([]byte(raw), &top))
		require.Len(t, top, 1)
		p := plan{mode: mode, text: explainText(t, conn, args)}
		var walk func(n planNode)
		walk = func(n planNode) {
			p.nodes = append(p.nodes, n)
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(top[0].Plan)
		out = append(out, p)
	}
	_, err = conn.Exec(ctx, "RESET plan_cache_mode")
	require.NoError(t, err)
	return out
}

// explainText is the plan of sweep_plan in EXPLAIN's text form, for
// failure messages.
func explainText(t *testing.T, conn *pgxpool.Conn, args string) string {
	t.Helper()
	rows, err := conn.Query(context.Background(), "EXPLAIN EXECUTE sweep_plan ("+args+")")
	require.NoError(t, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var l string
		require.NoError(t, rows.Scan(&l))
		lines = append(lines, l)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}

// BenchmarkSweep measures a sweep batch against the table's size: on a
// table of 20,000 and one of 200,000 records, it reports each table's
// time per batch of 1,000 deleted records and their ratio (1 when a
// batch's cost does not grow with the table).
//
// "live records": the tables hold that many live records; each run adds
// 999 expired ones and sweeps them, one batch. "fell behind": the
// tables hold that many expired records, and each run sweeps them all,
// batch after batch.
func BenchmarkSweep(b *testing.B) {
	sizes := []int{20_000, 200_000}
	ctx := context.Background()
	fill := func(b *testing.B, pool *pgxpool.Pool, from, n int, expires string) {
		b.Helper()
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO idempotency_records
			(caller, key, fingerprint, fingerprint_version, status, stable_id, created_at, expires_at)
			SELECT 'c' || (i %% 97), 'k' || i, decode(repeat('00', 32), 'hex'), 2, 'COMPLETED', 's' || i,
				now() - interval '1 day', now() + interval '%s' + i * interval '1 microsecond'
			FROM generate_series(%d, %d) AS i`, expires, from, from+n-1))
		require.NoError(b, err)
		_, err = pool.Exec(ctx, "ANALYZE idempotency_records")
		require.NoError(b, err)
	}
	report := func(b *testing.B, perBatch []time.Duration) {
		for i, size := range sizes {
			b.ReportMetric(float64(perBatch[i].Nanoseconds()), fmt.Sprintf("ns/batch-%dk", size/1000))
		}
		b.ReportMetric(float64(perBatch[1])/float64(perBatch[0]), "ratio")
	}

	b.Run("live records", func(b *testing.B) {
		pools := make([]*pgxpool.Pool, len(sizes))
		for i, size := range sizes {
			pools[i] = benchPool(b)
			fill(b, pools[i], 1, size, "1 day")
		}
		spent := make([]time.Duration, len(sizes))
		batches := 0
		next := 1_000_000_000
		for b.Loop() {
			for i, pool := range pools {
				fill(b, pool, next, 999, "-1 hour")
				start := time.Now()
				n, err := New(pool, nil).Sweep(ctx, time.Now())
				spent[i] += time.Since(start)
				require.NoError(b, err)
				require.Equal(b, 999, n)
			}
			batches++
			next += 1000
		}
		perBatch := make([]time.Duration, len(sizes))
		for i := range sizes {
			perBatch[i] = spent[i] / time.Duration(batches)
		}
		report(b, perBatch)
	})

	b.Run("fell behind", func(b *testing.B) {
		pools := make([]*pgxpool.Pool, len(sizes))
		for i := range sizes {
			pools[i] = benchPool(b)
		}
		spent := make([]time.Duration, len(sizes))
		batches := make([]int, len(sizes))
		for b.Loop() {
			for i, pool := range pools {
				fill(b, pool, 1, sizes[i], "-1 hour")
				start := time.Now()
				n, err := New(pool, nil).Sweep(ctx, time.Now())
				spent[i] += time.Since(start)
				require.NoError(b, err)
				require.Equal(b, sizes[i], n)
				batches[i] += sizes[i]/defaultSweepBatch + 1
			}
		}
		perBatch := make([]time.Duration, len(sizes))
		for i := range sizes {
			perBatch[i] = spent[i] / time.Duration(batches[i])
		}
		report(b, perBatch)
	})
}

// benchPool is newPool for a benchmark.
func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.DSN(b))
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	require.NoError(b, Migrate(context.Background(), pool))
	return pool
}
