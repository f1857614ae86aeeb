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

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/internal/pgtest"
)

// sweepTableRows is how many rows the plan tests give a table: enough
// that reading all of them costs the planner far more than walking an
// index for one batch.
const sweepTableRows = 50_000

// TestSweep checks that the sweep deletes expired records in bounded
// batches, through the expires_at index.
func TestSweep(t *testing.T) {
	t.Run("deletes in batches", func(t *testing.T) {
		// The batches are counted between the statements.
		counts := &sweepCounts{}
		pool := newPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = counts })
		counter, err := pgxpool.New(context.Background(), pool.Config().ConnString())
		require.NoError(t, err)
		t.Cleanup(counter.Close)
		counts.pool = counter
		s := New(pool, &Options{SweepBatch: 7, Clock: clock.NewManual(t0.Add(2 * time.Hour))})
		ctx := context.Background()
		// 20 expired at t0+1h, 5 live until t0+3h.
		if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records
		(caller, key, fingerprint, fingerprint_version, status, stable_id, created_at, expires_at)
		SELECT 'c', 'k' || i, decode(repeat('00', 32), 'hex'), 2, 'COMPLETED', 's' || i,
			$1::timestamptz, $1::timestamptz + CASE WHEN i <= 20 THEN interval '1 hour' ELSE interval '3 hours' END
		FROM generate_series(1, 25) AS i`, t0); err != nil {
			t.Fatal(err)
		}
		n, err := s.Sweep(ctx, t0.Add(2*time.Hour))
		if err != nil || n != 20 {
			t.Fatalf("Sweep = %d, %v; want 20, nil", n, err)
		}
		var records int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_records").Scan(&records); err != nil || records != 5 {
			t.Errorf("%d records left, %v; want the 5 live records", records, err)
		}
		if batches := counts.batches(records); fmt.Sprint(batches) != "[7 7 6]" {
			t.Errorf("batches %v, want [7 7 6]", batches)
		}
	})

	// The sweep's batch statement reads the records through the expires_at
	// index, and nowhere reads the whole table, on a table of live records
	// with a few expired among them, after ANALYZE. It holds for the plan
	// made for the batch's values and for the generic plan that a prepared
	// statement may switch to after five runs.
	t.Run("walks the expires_at index", func(t *testing.T) {
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
	})
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
// batch's cost does not grow with the table). Times on a shared machine
// are noisy, so it reports too the database blocks (8 kB pages, from
// EXPLAIN (ANALYZE, BUFFERS)) that a batch touches, and their ratio,
// which do not depend on the machine.
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
	// report reports the time of timed batches and the blocks of
	// explained ones, per batch, for each size, and their ratios.
	report := func(b *testing.B, spent []time.Duration, timed []int, blocks []int64, explained []int) {
		perBatch := func(i int) (ns, blk float64) {
			return float64(spent[i].Nanoseconds()) / float64(timed[i]), float64(blocks[i]) / float64(explained[i])
		}
		for i, size := range sizes {
			ns, blk := perBatch(i)
			b.ReportMetric(ns, fmt.Sprintf("ns/batch-%dk", size/1000))
			b.ReportMetric(blk, fmt.Sprintf("blocks/batch-%dk", size/1000))
		}
		ns0, blk0 := perBatch(0)
		ns1, blk1 := perBatch(1)
		b.ReportMetric(ns1/ns0, "time-ratio")
		b.ReportMetric(blk1/blk0, "blocks-ratio")
	}

	b.Run("live records", func(b *testing.B) {
		pools := make([]*pgxpool.Pool, len(sizes))
		for i, size := range sizes {
			pools[i] = sweepPool(b)
			fill(b, pools[i], 1, size, "1 day")
		}
		spent := make([]time.Duration, len(sizes))
		blocks := make([]int64, len(sizes))
		batches := make([]int, len(sizes)) // each timed, and one more explained
		next := 1_000_000_000
		for b.Loop() {
			for i, pool := range pools {
				fill(b, pool, next, 999, "-1 hour")
				start := time.Now()
				n, err := New(pool, nil).Sweep(ctx, time.Now())
				spent[i] += time.Since(start)
				require.NoError(b, err)
				require.Equal(b, 999, n)
				fill(b, pool, next+1000, 999, "-1 hour")
				blocks[i] += batchBlocks(b, pool, nil)
				batches[i]++
			}
			next += 2000
		}
		report(b, spent, batches, blocks, batches)
	})

	b.Run("fell behind", func(b *testing.B) {
		pools := make([]*pgxpool.Pool, len(sizes))
		for i := range sizes {
			pools[i] = sweepPool(b)
		}
		spent := make([]time.Duration, len(sizes))
		blocks := make([]int64, len(sizes))
		timed := make([]int, len(sizes))
		explained := make([]int, len(sizes))
		for b.Loop() {
			for i, pool := range pools {
				fill(b, pool, 1, sizes[i], "-1 hour")
				start := time.Now()
				n, err := New(pool, nil).Sweep(ctx, time.Now())
				spent[i] += time.Since(start)
				require.NoError(b, err)
				require.Equal(b, sizes[i], n)
				timed[i] += sizes[i]/defaultSweepBatch + 1

				// The same sweep again, each batch explained: from the
				// last batch's latest expiry, as Sweep goes.
				fill(b, pool, 1, sizes[i], "-1 hour")
				var from *time.Time
				for {
					var last *time.Time
					require.NoError(b, pool.QueryRow(ctx, `SELECT max(expires_at) FROM (SELECT expires_at FROM idempotency_records
						WHERE expires_at >= coalesce($1::timestamptz, '-infinity') ORDER BY expires_at LIMIT $2) AS b`,
						from, defaultSweepBatch).Scan(&last))
					blocks[i] += batchBlocks(b, pool, from)
					explained[i]++
					if last == nil {
						break
					}
					from = last
				}
			}
		}
		report(b, spent, timed, blocks, explained)
	})
}

// batchBlocks runs one sweep batch from expiry from under EXPLAIN
// (ANALYZE, BUFFERS) and returns the shared blocks it touched (hit or
// read), planning included.
func batchBlocks(b *testing.B, pool *pgxpool.Pool, from *time.Time) int64 {
	b.Helper()
	var raw string
	require.NoError(b, pool.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sweepSQL,
		nil, from, defaultSweepBatch).Scan(&raw))
	var out []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
		Planning struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Planning"`
	}
	require.NoError(b, json.Unmarshal([]byte(raw), &out))
	require.Len(b, out, 1)
	return out[0].Plan.Hit + out[0].Plan.Read + out[0].Planning.Hit + out[0].Planning.Read
}

// sweepPool is newPool for a benchmark.
func sweepPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.DSN(b))
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	require.NoError(b, Migrate(context.Background(), pool))
	return pool
}
