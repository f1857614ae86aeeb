package pgstore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
)

// payHandler writes a payment row through the store's transaction, and
// answers 500 instead when the request has an X-Fail header.
func payHandler(w http.ResponseWriter, r *http.Request) {
	info, _ := idempotency.FromContext(r.Context())
	err := idempotency.OnCommit(r.Context(), func(ctx context.Context) error {
		tx, ok := Tx(ctx)
		if !ok {
			return errors.New("no transaction")
		}
		_, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ($1)", info.StableID)
		return err
	})
	if err != nil || r.Header.Get("X-Fail") != "" {
		http.Error(w, "failed", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte("paid " + info.StableID))
}

// TestMiddleware checks the middleware over PostgreSQL: one run of the
// work, and nothing of the database shown.
func TestMiddleware(t *testing.T) {
	t.Run("runs the work once over PostgreSQL", func(t *testing.T) {
		pool := newPool(t)
		ctx := context.Background()
		if _, err := pool.Exec(ctx, "CREATE TABLE payments (id text PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		h := idempotency.New(http.HandlerFunc(payHandler), idempotency.Config{Store: New(pool, nil), Principal: anyone})
		post := func(target, key string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, strings.TrimSuffix(target, "?fail"), strings.NewReader(`{"amount":1}`))
			r.Header.Set("Idempotency-Key", key)
			if strings.HasSuffix(target, "?fail") {
				r.Header.Set("X-Fail", "1") // a header is not part of the fingerprint
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		payments := func() int {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}

		// A server error drops the effect and frees the key.
		if w := post("/pay?fail", "k1"); w.Code != http.StatusInternalServerError || payments() != 0 {
			t.Fatalf("failing request: %d, %d payments; want 500, 0", w.Code, payments())
		}

		// 50 concurrent requests on one key: one payment, every answer the
		// same 201 or a 409.
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		bodies := map[string]bool{}
		for range 50 {
			wg.Go(func() {
				w := post("/pay", "k1")
				mu.Lock()
				defer mu.Unlock()
				codes[w.Code]++
				if w.Code == http.StatusCreated {
					bodies[w.Body.String()] = true
				}
			})
		}
		wg.Wait()
		if payments() != 1 || codes[http.StatusCreated] == 0 || codes[http.StatusCreated]+codes[http.StatusConflict] != 50 || len(bodies) != 1 {
			t.Errorf("50 requests on one key: %d payments, codes %v, %d distinct bodies; want 1 payment, 201s and 409s, 1 body",
				payments(), codes, len(bodies))
		}
		w := post("/pay", "k1")
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || !bodies[w.Body.String()] {
			t.Errorf("replay: %d %q %q", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
		}
	})

	// Two middleware instances on one database, one host's clock 30 s ahead
	// of the other's, a lease of 10 s. Whichever host takes the key first,
	// the other finds the lease alive on the database's clock and answers
	// 409, with the Retry-After of the work's expected 3 s on that clock:
	// the handler runs once.
	t.Run("runs once across hosts whose clocks disagree", func(t *testing.T) {
		for _, c := range []struct {
			name         string
			first, other time.Duration // each host's clock, from the real time
		}{
			{"the host behind first", 0, 30 * time.Second},
			{"the host ahead first", 30 * time.Second, 0},
		} {
			t.Run(c.name, func(t *testing.T) {
				pool := newPool(t)
				var runs atomic.Int32
				started, release := make(chan struct{}), make(chan struct{})
				slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 { // a second run answers at once
						close(started)
						<-release
					}
					w.WriteHeader(http.StatusCreated)
				})
				host := func(skew time.Duration) http.Handler {
					// Each host has a Store of its own, as a process does, on
					// the database's clock.
					return idempotency.New(slow, idempotency.Config{Store: New(pool, nil), Principal: anyone,
						Clock: clock.NewManual(time.Now().Add(skew)), Lease: 10 * time.Second, Expected: 3 * time.Second})
				}
				first, other := host(c.first), host(c.other)
				serve := func(h http.Handler) (int, string) {
					r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
					r.Header.Set("Idempotency-Key", "skewed")
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					return w.Code, w.Header().Get("Retry-After")
				}
				done := make(chan int)
				go func() { code, _ := serve(first); done <- code }()
				<-started
				code, retryAfter := serve(other)
				assert.Equal(t, http.StatusConflict, code, "the lease is alive on the database's clock")
				// 3, or 2 if more than a second has passed since the insert.
				assert.Contains(t, []string{"2", "3"}, retryAfter, "the work is expected in 3 s on the database's clock")
				close(release)
				assert.Equal(t, http.StatusCreated, <-done)
				code, _ = serve(other)
				assert.Equal(t, http.StatusCreated, code, "the replay")
				assert.EqualValues(t, 1, runs.Load(), "the handler ran more than once")
			})
		}
	})

	// It provokes real PostgreSQL errors (a statement timeout behind a
	// lock, a check constraint, a dropped table): each answer is a 500
	// problem with nothing internal in it, and the database's message goes
	// to Config.Logger.
	t.Run("database errors are logged and never shown", func(t *testing.T) {
		pool := newPool(t)
		ctx := context.Background()
		cfg := pool.Config().Copy()
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "200ms"
		timed, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(timed.Close)
		var logged strings.Builder
		var logMu sync.Mutex
		logger := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logged}, nil))
		h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }),
			idempotency.Config{Store: New(timed, nil), Principal: anyone, Logger: logger})
		post := func(key string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		internal := []string{"SQLSTATE", "idempotency_records", "statement timeout", "canceling", "relation", "constraint", "pgstore", "ERROR"}

		for _, c := range []struct {
			name, key, want string
			provoke         func(t *testing.T)
		}{
			{"statement timeout", "k-timeout", "57014", func(t *testing.T) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback(ctx) })
				if _, err := tx.Exec(ctx, "LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE"); err != nil {
					t.Fatal(err)
				}
			}},
			{"check constraint", "k-constraint", "23514", func(t *testing.T) {
				if _, err := pool.Exec(ctx, "ALTER TABLE idempotency_records ADD CONSTRAINT short_keys CHECK (length(key) < 5)"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = pool.Exec(ctx, "ALTER TABLE idempotency_records DROP CONSTRAINT short_keys") })
			}},
			{"dropped table", "k-dropped", "42P01", func(t *testing.T) {
				if _, err := pool.Exec(ctx, "DROP TABLE idempotency_records"); err != nil {
					t.Fatal(err)
				}
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				c.provoke(t)
				w := post(c.key)
				if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "https://idem.dev/problems/internal-error") {
					t.Fatalf("answer = %d %s; want a 500 problem", w.Code, w.Body)
				}
				for _, s := range internal {
					if strings.Contains(w.Body.String(), s) {
						t.Errorf("the answer shows %q: %s", s, w.Body)
					}
				}
				logMu.Lock()
				defer logMu.Unlock()
				if !strings.Contains(logged.String(), c.want) {
					t.Errorf("the log lacks SQLSTATE %s:\n%s", c.want, logged.String())
				}
			})
		}
	})

	// In both modes, a confidential answer's record is COMPLETED with its
	// status and headers and an empty body in the database; the replay
	// carries the marker the record kept, and the work runs once.
	t.Run("a stored answer without its body replays", func(t *testing.T) {
		const secret = "sk_live_4242424242424242"
		for _, oneTx := range []bool{false, true} {
			t.Run(map[bool]string{false: "in the lease mode", true: "in one transaction"}[oneTx], func(t *testing.T) {
				pool := newPool(t)
				ctx := context.Background()
				var runs atomic.Int32
				h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Location", "/keys/1")
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(`{"key":"` + secret + `"}`))
				}), idempotency.Config{Store: New(pool, nil), Principal: anyone, OneTransaction: oneTx,
					Confidential: func(*http.Request) bool { return true }})
				post := func() *httptest.ResponseRecorder {
					r := httptest.NewRequest(http.MethodPost, "/keys", strings.NewReader(`{}`))
					r.Header.Set("Idempotency-Key", "k1")
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					return w
				}
				first := post()
				require.Equal(t, http.StatusCreated, first.Code)
				assert.Contains(t, first.Body.String(), secret, "the fresh answer is whole")

				var (
					status, header string
					body           []byte
				)
				require.NoError(t, pool.QueryRow(ctx, `SELECT status, response_header::text, response_body FROM idempotency_records WHERE key = 'k1'`).
					Scan(&status, &header, &body))
				assert.Equal(t, idempotency.StatusCompleted, status)
				assert.Empty(t, body, "no body at rest")
				assert.Contains(t, header, "confidential")

				replay := post()
				assert.EqualValues(t, 1, runs.Load())
				require.Equal(t, http.StatusCreated, replay.Code)
				assert.Equal(t, "confidential", replay.Header().Get("Idempotent-Body-Omitted"))
				assert.Equal(t, "/keys/1", replay.Header().Get("Location"))
				assert.Empty(t, replay.Body.String())
			})
		}
	})
}

// anyone is the Principal of tests with one caller.
func anyone(*http.Request) string { return "" }

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// onCommit is a handler of the lease mode whose effect runs in
// idempotency.OnCommit on the transaction Complete gives it (Tx): it
// answers 201 when the effect succeeds, 500 with its error otherwise.
func onCommit(effect func(ctx context.Context, tx pgx.Tx) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := idempotency.OnCommit(r.Context(), func(ctx context.Context) error {
			tx, _ := Tx(ctx)
			return effect(ctx, tx)
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
}
