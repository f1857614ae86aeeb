package pgstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/pgtest"
)

// benchBody is the payment that cmd/idembench sends.
var benchBody = []byte(`{"amount":1000,"currency":"EUR","customer":"cus_123"}`)

// benchPay is idembench's payment handler: it writes one row, through the
// request's transaction behind the middleware, in a transaction of its own
// when mounted bare.
func benchPay(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := "pay_" + rand.Text()
		if info, ok := idempotency.FromContext(r.Context()); ok {
			id = info.StableID
		}
		const insert = `INSERT INTO bench_payments (id, amount) VALUES ($1, $2)`
		var err error
		if tx, ok := Tx(r.Context()); ok {
			_, err = tx.Exec(r.Context(), insert, id, 1000)
		} else {
			err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(r.Context(), insert, id, 1000)
				return err
			})
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+id)
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":%q,"amount":1000}`+"\n", id)
	}
}

// benchPool is a pool on a new database with the schema and the payments
// table; configure, if not nil, changes its configuration first.
func benchPool(tb testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(tb))
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 32
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := Migrate(context.Background(), pool); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE bench_payments (id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	return pool
}

// benchPost sends a payment with key to h and fails unless it is a 201.
func benchPost(tb testing.TB, h http.Handler, key string) {
	r := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(benchBody))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		tb.Errorf("status %d: %s", w.Code, w.Body)
	}
}

// BenchmarkOneTransaction puts a fresh key in the single-transaction mode
// beside the same handler mounted bare, on one pool, 16 requests at once
// (with GOMAXPROCS 2), as idembench's concurrency 16. Its CPU profile is
// the middleware's and RunOnce's path:
//
//	IDEM_REQUIRE_POSTGRES=1 go test -run '^$' -bench OneTransaction -cpuprofile cpu.out ./idempotency/pgstore
//
// On Linux, with the server on this host, it also reports the CPU time
// per request of this process (go-cpu-µs/op) and of the server
// (pg-cpu-µs/op): at concurrency 16 on two cores, throughput is what the
// CPU allows, and CPU time is far steadier than wall time on a loaded
// machine.
func BenchmarkOneTransaction(b *testing.B) {
	pool := benchPool(b, nil)
	bare := benchPay(pool)
	once := idempotency.New(benchPay(pool), idempotency.Config{Store: New(pool, nil),
		Principal: func(*http.Request) string { return "bench" }, OneTransaction: true})
	for _, v := range []struct {
		name string
		h    http.Handler
	}{{"bare", bare}, {"fresh key", once}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16 / max(1, min(16, runtime.GOMAXPROCS(0))))
			meter := cpuMeter(pool)
			var self0, server0 time.Duration
			if meter != nil {
				self0, server0 = meter()
			}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					benchPost(b, v.h, uuid.NewString())
				}
			})
			if meter != nil {
				self, server := meter()
				b.ReportMetric(float64((self-self0).Microseconds())/float64(b.N), "go-cpu-µs/op")
				b.ReportMetric(float64((server-server0).Microseconds())/float64(b.N), "pg-cpu-µs/op")
			}
		})
	}
}
