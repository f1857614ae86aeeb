package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// variant is one way of doing the same request, measured beside the others.
type variant struct {
	name string
	// do makes one request and reports an error when it did not succeed.
	do func(ctx context.Context) error
	// slow, if above 1, makes the variant's batches that many times
	// smaller, for variants (durable writes) whose every request takes
	// milliseconds.
	slow int
}

// Result is what was measured for one variant.
type Result struct {
	Name     string
	Requests int
	// Wall is the time the variant's batches took, end to end; RPS is
	// Requests/Wall.
	Wall     time.Duration
	RPS      float64
	P50, P99 time.Duration
	// Allocs is the mean number of heap allocations per request in the
	// whole process: the in-process server's are included, and are the
	// same for every variant that asks it the same thing.
	Allocs float64
	// Ratio is P50 over the baseline's P50 (the first variant's).
	Ratio float64
}

// sample accumulates the measurements of one variant across batches.
type sample struct {
	lat  []time.Duration
	wall time.Duration
}

// interleave runs n requests of each variant in rounds: in each round,
// every variant runs a batch of batch requests, with conc goroutines, in
// an order shuffled every round, so that drift of the machine (other
// processes, GC debt, the server's growing tables) hits every variant
// alike and no variant always follows the same one. Each batch starts
// with warmup unmeasured requests (for variants measured after a pause).
// Nothing else runs in the timed region: allocations are counted in a
// separate pass (allocsPer), since reading memory statistics stops the
// world and slows the request after it. The first variant is the
// baseline of the ratios and sets the number of rounds; it must not be
// slow.
func interleave(ctx context.Context, vs []variant, n, batch, conc, warmup int) ([]Result, error) {
	batch = max(batch, 1)
	out := make([]Result, len(vs))
	for i, v := range vs {
		a, err := allocsPer(ctx, v, allocRuns(v))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		out[i].Allocs = a
	}
	samples := make([]sample, len(vs))
	for i := range samples {
		samples[i].lat = make([]time.Duration, 0, n)
	}
	rng := rand.New(rand.NewPCG(1, 2)) // the same order on every run
	order := make([]int, len(vs))
	for i := range order {
		order[i] = i
	}
	for {
		left := n - len(samples[0].lat)
		if left <= 0 {
			break
		}
		size := min(batch, left)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			s := &samples[k]
			if warmup > 0 {
				for range max(1, warmup/max(1, vs[k].slow)) {
					if err := vs[k].do(ctx); err != nil {
						return nil, fmt.Errorf("%s: %w", vs[k].name, err)
					}
				}
			}
			lat, wall, err := runBatch(ctx, vs[k].do, max(1, size/max(1, vs[k].slow)), conc)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", vs[k].name, err)
			}
			s.wall += wall
			s.lat = append(s.lat, lat...)
			if vs[k].slow > 1 {
				// Let the writeback its fsyncs started settle, so that it
				// does not slow the next variant's batch.
				time.Sleep(cooldown)
			}
		}
	}
	for i, s := range samples {
		r := &out[i]
		r.Name, r.Requests, r.Wall = vs[i].name, len(s.lat), s.wall
		r.P50, r.P99 = percentiles(s.lat)
		if s.wall > 0 {
			r.RPS = float64(len(s.lat)) / s.wall.Seconds()
		}
	}
	for i := range out {
		if out[0].P50 > 0 {
			out[i].Ratio = float64(out[i].P50) / float64(out[0].P50)
		}
	}
	return out, nil
}

// allocRuns is how many requests allocsPer makes for v.
func allocRuns(v variant) int { return max(10, 200/max(1, v.slow)) }

// allocsPer returns the mean number of heap allocations of the whole
// process per request of v, over runs sequential requests: the in-process
// server's are included, and are the same for every variant that asks it
// the same thing.
func allocsPer(ctx context.Context, v variant, runs int) (float64, error) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.Mallocs
	for range runs {
		if err := v.do(ctx); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&ms)
	return float64(ms.Mallocs-before) / float64(runs), nil
}

// cooldown is the pause after a batch of a slow variant.
const cooldown = 20 * time.Millisecond

// runBatch makes size requests with conc goroutines and returns each one's
// latency and the batch's wall time.
func runBatch(ctx context.Context, do func(context.Context) error, size, conc int) ([]time.Duration, time.Duration, error) {
	conc = max(1, min(conc, size))
	lat := make([]time.Duration, size)
	if conc == 1 {
		// No goroutine to start and wait for: nothing but the requests
		// between the clock readings.
		start := time.Now()
		for i := range lat {
			t0 := time.Now()
			err := do(ctx)
			lat[i] = time.Since(t0)
			if err != nil {
				return lat[:i+1], time.Since(start), err
			}
		}
		return lat, time.Since(start), nil
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= size {
					return
				}
				t0 := time.Now()
				err := do(ctx)
				lat[i] = time.Since(t0)
				if err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(size)) // stop the others
					return
				}
			}
		})
	}
	wg.Wait()
	return lat, time.Since(start), firstErr
}

// percentiles returns the 50th and 99th percentiles of lat (nearest rank).
func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	rank := func(p int) time.Duration {
		i := (len(s)*p + 99) / 100 // ceil(len*p/100), 1-based
		return s[max(i, 1)-1]
	}
	return rank(50), rank(99)
}
