package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/pgstore"
)

// PGConfig sizes the PostgreSQL run.
type PGConfig struct {
	// Requests per variant at each concurrency.
	Requests int
	// Concurrencies to measure at (goroutines sending at once).
	Concurrencies []int
	// Batch is the number of requests per variant before the next takes
	// its turn.
	Batch int
	// StormRequests concurrent requests share one key; StormDelay is the
	// handler's processing time, so that they overlap.
	StormRequests int
	StormDelay    time.Duration
	// NoStorm skips the storm.
	NoStorm bool
}

// PGDefaults is a full PostgreSQL run.
func PGDefaults() PGConfig {
	return PGConfig{Requests: 3000, Concurrencies: []int{1, 16}, Batch: 50, StormRequests: 300, StormDelay: 250 * time.Millisecond}
}

// PGQuick is a short PostgreSQL run.
func PGQuick() PGConfig {
	return PGConfig{Requests: 400, Concurrencies: []int{1, 16}, Batch: 20, StormRequests: 300, StormDelay: 250 * time.Millisecond}
}

// PGReport is the outcome of the PostgreSQL run.
type PGReport struct {
	// Server is the database's version and durability settings.
	Server string
	// ByConcurrency holds, per concurrency, the bare handler (the
	// baseline), then fresh keys and replays in the single-transaction
	// mode, then in the lease mode (see pgVariants).
	ByConcurrency map[int][]Result
	Concurrencies []int
	Storm         *StormReport
	// OtherKeys is the p50 of fresh keys on other keys, calm and during
	// the storm.
	OtherKeys *OtherKeysReport
}

// OtherKeysReport is what a same-key storm costs the requests for other
// keys: their p50 calm, just before the storm, and while it runs.
type OtherKeysReport struct {
	Calm, Storm           time.Duration
	CalmCount, StormCount int
}

// The variants of the PostgreSQL run, in their order in
// PGReport.ByConcurrency.
const (
	pgBare = iota
	pgFresh1tx
	pgReplay1tx
	pgFreshLease
	pgReplayLease
)

// Ratio returns the p50 of variant v over the bare handler's at
// concurrency 1.
func (r *PGReport) ratio(v int) float64 {
	rs := r.ByConcurrency[1]
	if len(rs) <= v {
		return 0
	}
	return rs[v].Ratio
}

// pgBench is the payment handler and the database it writes to.
type pgBench struct {
	pool       *pgxpool.Pool
	executions atomic.Int64
	// slowKey's requests take delay, and slowRuns counts their runs.
	slowKey  string
	delay    time.Duration
	slowRuns atomic.Int64
}

// pay is the handler measured: it parses the payment and writes one row.
// Behind the middleware the row joins the record's transaction (see
// pgstore.Tx); bare, OnCommit runs the effect at once and the effect
// writes the row in a transaction of its own.
func (b *pgBench) pay(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
		Customer string `json:"customer"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	b.executions.Add(1)
	if b.slowKey != "" && r.Header.Get("Idempotency-Key") == b.slowKey {
		b.slowRuns.Add(1)
		time.Sleep(b.delay)
	}
	id := "pay_" + rand.Text()
	if info, ok := idempotency.FromContext(r.Context()); ok {
		id = info.StableID
	}
	const insert = `INSERT INTO bench_payments (id, amount, currency, customer) VALUES ($1, $2, $3, $4)`
	err := idempotency.OnCommit(r.Context(), func(ctx context.Context) error {
		if tx, ok := pgstore.Tx(ctx); ok {
			_, err := tx.Exec(ctx, insert, id, req.Amount, req.Currency, req.Customer)
			return err
		}
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, id, req.Amount, req.Currency, req.Customer)
			return err
		})
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+id)
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q,"amount":%d,"currency":%q,"customer":%q}`+"\n", id, req.Amount, req.Currency, req.Customer)
}

// RunPostgres compares, on the database dsn, the idempotency middleware over
// pgstore with the same handler mounted bare, writing the same payment row
// in its own transaction; then sends a same-key storm through the
// middleware. Handlers are called in process (no network), so the figures
// are the server's own. It creates its tables if needed and empties them.
func RunPostgres(ctx context.Context, dsn string, cfg PGConfig, progress io.Writer) (*PGReport, error) {
	if progress == nil {
		progress = io.Discard
	}
	progress = &stamped{w: progress, start: time.Now()}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	maxConc := 1
	for _, c := range cfg.Concurrencies {
		maxConc = max(maxConc, c)
	}
	pcfg.MaxConns = int32(max(maxConc*2, 8))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_payments (
		id text PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL, customer text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE bench_payments, idempotency_records`); err != nil {
		return nil, err
	}
	rep := &PGReport{ByConcurrency: map[int][]Result{}, Concurrencies: cfg.Concurrencies}
	var version, fsync, syncCommit string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')`).
		Scan(&version, &fsync, &syncCommit); err != nil {
		return nil, err
	}
	rep.Server = fmt.Sprintf("PostgreSQL %s, fsync=%s, synchronous_commit=%s", version, fsync, syncCommit)

	b := &pgBench{pool: pool}
	bare := http.HandlerFunc(b.pay)
	oneCaller := func(*http.Request) string { return "bench" }
	layered := idempotency.New(http.HandlerFunc(b.pay), idempotency.Config{Store: pgstore.New(pool, nil), Principal: oneCaller})
	oneTx := func(pool *pgxpool.Pool) http.Handler {
		return idempotency.New(http.HandlerFunc(b.pay), idempotency.Config{Store: pgstore.New(pool, nil), Principal: oneCaller, OneTransaction: true})
	}
	once := oneTx(pool)
	serve := func(h http.Handler, key string) error {
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/payments", bytes.NewReader(paymentBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			return fmt.Errorf("status %d: %s", rec.Code, rec.Body)
		}
		return nil
	}
	replayKey, replayKey1tx := uuid.NewString(), uuid.NewString()
	if err := serve(layered, replayKey); err != nil {
		return nil, err
	}
	if err := serve(once, replayKey1tx); err != nil {
		return nil, err
	}
	vs := []variant{
		pgBare:        {name: "bare handler, own transaction", do: func(context.Context) error { return serve(bare, uuid.NewString()) }},
		pgFresh1tx:    {name: "one transaction, fresh key", do: func(context.Context) error { return serve(once, uuid.NewString()) }},
		pgReplay1tx:   {name: "one transaction, replay", do: func(context.Context) error { return serve(once, replayKey1tx) }},
		pgFreshLease:  {name: "lease, fresh key", do: func(context.Context) error { return serve(layered, uuid.NewString()) }},
		pgReplayLease: {name: "lease, replay", do: func(context.Context) error { return serve(layered, replayKey) }},
	}
	warm(ctx, vs, 50)
	for _, c := range cfg.Concurrencies {
		fmt.Fprintf(progress, "postgres: %d requests per variant, concurrency %d\n", cfg.Requests, c)
		if rep.ByConcurrency[c], err = interleave(ctx, vs, cfg.Requests, cfg.Batch, c, 3); err != nil {
			return nil, err
		}
	}

	if cfg.NoStorm {
		return rep, nil
	}
	// Three servers, each with its own pool and middleware (its own
	// flights), as three processes on one database would be.
	fmt.Fprintf(progress, "postgres: storm of %d requests on one key over three servers\n", cfg.StormRequests)
	servers := []http.Handler{once}
	for range 2 {
		p, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		servers = append(servers, oneTx(p))
	}
	other := func() error { return serve(once, uuid.NewString()) }
	if rep.Storm, rep.OtherKeys, err = pgStorm(servers, b, cfg.StormRequests, cfg.StormDelay, other); err != nil {
		return nil, err
	}
	return rep, nil
}

// pgStorm sends n concurrent requests with one key, spread over the
// servers, whose handler takes delay, and counts the answers and
// executions. Meanwhile it sends requests for fresh keys, one at a time,
// with other, and compares their p50 with that of as many sent just before.
func pgStorm(servers []http.Handler, b *pgBench, n int, delay time.Duration, other func() error) (*StormReport, *OtherKeysReport, error) {
	calm := make([]time.Duration, 0, 200)
	for range cap(calm) {
		t0 := time.Now()
		if err := other(); err != nil {
			return nil, nil, err
		}
		calm = append(calm, time.Since(t0))
	}
	key := uuid.NewString()
	b.slowKey, b.delay = key, delay
	defer func() { b.slowKey, b.delay = "", 0 }()
	before := b.slowRuns.Load()
	status := make([]int, n)
	replayed := make([]bool, n)
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for i := range n {
		ready.Add(1)
		h := servers[i%len(servers)]
		done.Go(func() {
			req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/payments", bytes.NewReader(paymentBody))
			req.Header.Set("Idempotency-Key", key)
			rec := httptest.NewRecorder()
			ready.Done()
			<-release
			h.ServeHTTP(rec, req)
			status[i] = rec.Code
			replayed[i] = rec.Header().Get("Idempotent-Replayed") == "true"
		})
	}
	ready.Wait()
	stormDone := make(chan struct{})
	var during []time.Duration
	var otherErr error
	var otherDone sync.WaitGroup
	otherDone.Go(func() {
		for {
			select {
			case <-stormDone:
				return
			default:
			}
			t0 := time.Now()
			if otherErr = other(); otherErr != nil {
				return
			}
			during = append(during, time.Since(t0))
		}
	})
	start := time.Now()
	close(release)
	done.Wait()
	r := &StormReport{Requests: n, ProcessingDelay: delay, AllAnswered: time.Since(start), Executions: int(b.slowRuns.Load() - before)}
	close(stormDone)
	otherDone.Wait()
	if otherErr != nil {
		return nil, nil, otherErr
	}
	for i, s := range status {
		switch {
		case s == http.StatusCreated && replayed[i]:
			r.Replayed++
		case s == http.StatusCreated:
			r.Created++
		case s == http.StatusConflict:
			r.InProgress++
		default:
			r.Other++
		}
	}
	ok := &OtherKeysReport{CalmCount: len(calm), StormCount: len(during)}
	ok.Calm, _ = percentiles(calm)
	ok.Storm, _ = percentiles(during)
	if r.Executions != 1 {
		return r, ok, errors.New("the storm executed the payment more than once")
	}
	return r, ok, nil
}

// Print writes the PostgreSQL report as tables.
func (r *PGReport) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "%s\n", r.Server)
	for _, c := range r.Concurrencies {
		fmt.Fprintf(w, "POST /payments over PostgreSQL, called in process, concurrency %d\n", c)
		results(tw, r.ByConcurrency[c], "x bare")
		tw.Flush()
	}
	if r.Storm != nil {
		r.printStorm(w)
	}
	for _, c := range r.Concurrencies {
		if rs := r.ByConcurrency[c]; len(rs) > pgFresh1tx && rs[pgBare].RPS > 0 {
			fmt.Fprintf(w, "throughput pg-fresh-1tx/bare, concurrency %d: %.2f\n", c, rs[pgFresh1tx].RPS/rs[pgBare].RPS)
		}
	}
	if len(r.ByConcurrency[1]) == 0 {
		return // the p50 ratios are at concurrency 1
	}
	fmt.Fprintf(w, "ratio pg-fresh-lease/bare: %.2f\n", r.ratio(pgFreshLease))
	fmt.Fprintf(w, "ratio pg-replay-1tx/bare: %.2f\n", r.ratio(pgReplay1tx))
	fmt.Fprintf(w, "ratio pg-fresh-1tx/bare: %.2f\n", r.ratio(pgFresh1tx))
}

// printStorm writes the storm's lines.
func (r *PGReport) printStorm(w io.Writer) {
	s := r.Storm
	fmt.Fprintf(w, "same-key storm over PostgreSQL: %d concurrent requests, one key, processing %v\n", s.Requests, s.ProcessingDelay)
	fmt.Fprintf(w, "  executions %d (must be 1), 201 fresh: %d, 201 replayed: %d, 409 in progress: %d, other: %d, all answered in %s\n",
		s.Executions, s.Created, s.Replayed, s.InProgress, s.Other, dur(s.AllAnswered))
	if o := r.OtherKeys; o != nil {
		fmt.Fprintf(w, "  other keys, one at a time, one transaction: p50 %s calm (%d requests), %s during the storm (%d requests): %.2fx\n",
			dur(o.Calm), o.CalmCount, dur(o.Storm), o.StormCount, float64(o.Storm)/float64(max(o.Calm, 1)))
	}
}
