package idempotency_test

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counter is a handler whose effect adds to a counter through OnCommit.
type counter struct {
	status      int
	nothingDone bool // the handler calls NothingDone
	effects     atomic.Int32
	runs        atomic.Int32
	block       chan struct{} // if not nil, the handler waits on it
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.runs.Add(1)
	if c.block != nil {
		<-c.block
	}
	if c.nothingDone {
		idempotency.NothingDone(r.Context())
	}
	_ = idempotency.OnCommit(r.Context(), func(context.Context) error { c.effects.Add(1); return nil })
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(c.status)
	_, _ = w.Write([]byte("done"))
}

// anyone is the Principal of tests with one caller.
func anyone(*http.Request) string { return "" }

func serve(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.HeaderKey, key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestLease checks the lease a worker holds on its record while the
// work runs.
func TestLease(t *testing.T) {
	// Work expected to take longer than the lease answers a resend's 409
	// with the time left on the lease, when the record may be taken over,
	// not the time the work was expected to take.
	t.Run("a 409's Retry-After never passes the lease", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(t0)
		slow := &counter{status: 201, block: make(chan struct{})}
		m := idempotency.New(slow, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}, Clock: clk,
			Lease: 30 * time.Second, Expected: 60 * time.Second})
		var wg sync.WaitGroup
		wg.Go(func() { serve(m, "k", "x") })
		require.Eventually(t, func() bool { return slow.runs.Load() == 1 }, 10*time.Second, time.Millisecond)

		clk.Advance(25 * time.Second)
		again := serve(m, "k", "x")
		assert.Equal(t, http.StatusConflict, again.Code)
		assert.Equal(t, "5", again.Header().Get("Retry-After"), "the lease ends in 5 s")
		close(slow.block)
		wg.Wait()
	})

	t.Run("a worker that lost its lease discards its effect", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(t0)
		store := &idempotency.MemoryStore{}
		slow := &counter{status: 201, block: make(chan struct{})}
		slowM := idempotency.New(slow, idempotency.Config{Principal: anyone, Store: store, Clock: clk, Lease: time.Second})
		var wg sync.WaitGroup
		var first *httptest.ResponseRecorder
		wg.Go(func() { first = serve(slowM, "k", "x") })
		require.Eventually(t, func() bool { return slow.runs.Load() == 1 }, 10*time.Second, time.Millisecond)

		clk.Advance(time.Second)
		fast := &counter{status: 201}
		second := serve(idempotency.New(fast, idempotency.Config{Principal: anyone, Store: store, Clock: clk, Lease: time.Second}), "k", "x")
		assert.Equal(t, 201, second.Code, "the expired lease was taken over")

		close(slow.block)
		wg.Wait()
		assert.Equal(t, http.StatusConflict, first.Code, "the first worker lost its record")
		assert.Equal(t, "1", first.Header().Get("Retry-After"))
		assert.Zero(t, slow.effects.Load(), "its effect was discarded")
		assert.Equal(t, int32(1), fast.effects.Load())
	})

	// Hosts whose clocks are an hour ahead of the store's, or an hour
	// behind, answer as a host on the store's clock does. A duplicate's 409
	// says to retry after the work's expected time, and a dead worker's
	// record is taken over once its lease has ended by the store's clock,
	// not the host's.
	t.Run("leases are judged on the store's clock", func(t *testing.T) {
		for _, skew := range []time.Duration{time.Hour, -time.Hour} {
			name := "an hour ahead"
			if skew < 0 {
				name = "an hour behind"
			}
			t.Run("a 409's Retry-After counts on the store's clock, host "+name, func(t *testing.T) {
				storeClk := clock.NewManual(t0)
				store := &idempotency.MemoryStore{Clock: storeClk}
				cfg := func(skew time.Duration) idempotency.Config {
					return idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0.Add(skew)),
						Lease: 10 * time.Second, Expected: 3 * time.Second}
				}
				slow := &counter{status: 201, block: make(chan struct{})}
				var wg sync.WaitGroup
				wg.Go(func() { serve(idempotency.New(slow, cfg(0)), "k", "x") })
				require.Eventually(t, func() bool { return slow.runs.Load() == 1 }, 10*time.Second, time.Millisecond)

				other := &counter{status: 201}
				w := serve(idempotency.New(other, cfg(skew)), "k", "x")
				assert.Equal(t, http.StatusConflict, w.Code)
				assert.Equal(t, "3", w.Header().Get("Retry-After"), "the work is expected in 3 s on the store's clock")
				assert.Zero(t, other.runs.Load())
				close(slow.block)
				wg.Wait()
			})
			t.Run("a dead worker's record is taken over when its lease ends on the store's clock, host "+name, func(t *testing.T) {
				storeClk := clock.NewManual(t0)
				store := &idempotency.MemoryStore{Clock: storeClk}
				var infos []idempotency.Info
				var mu sync.Mutex
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					info, _ := idempotency.FromContext(r.Context())
					mu.Lock()
					infos = append(infos, info)
					first := len(infos) == 1
					mu.Unlock()
					if first {
						panic(http.ErrAbortHandler) // the worker dies
					}
					w.WriteHeader(201)
				})
				cfg := idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0), Lease: 10 * time.Second}
				assert.PanicsWithValue(t, http.ErrAbortHandler, func() { serve(idempotency.New(h, cfg), "k", "x") })

				cfg.Clock = clock.NewManual(t0.Add(skew))
				skewed := idempotency.New(h, cfg)
				storeClk.Advance(9 * time.Second)
				w := serve(skewed, "k", "x")
				assert.Equal(t, http.StatusConflict, w.Code, "the lease is alive on the store's clock")
				assert.Equal(t, "1", w.Header().Get("Retry-After"), "the lease ends in 1 s on the store's clock")
				storeClk.Advance(time.Second)
				w = serve(skewed, "k", "x")
				require.Equal(t, 201, w.Code, "the lease has ended on the store's clock: %s", w.Body)
				require.Len(t, infos, 2)
				assert.True(t, infos[1].Takeover)
				assert.Equal(t, infos[0].StableID, infos[1].StableID)
			})
			t.Run("a full store's Retry-After counts on the store's clock, host "+name, func(t *testing.T) {
				storeClk := clock.NewManual(t0)
				store := &idempotency.MemoryStore{Clock: storeClk, MaxRecords: 1}
				c := &counter{status: 201}
				cfg := idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0), Retention: time.Hour}
				require.Equal(t, 201, serve(idempotency.New(c, cfg), "a", "x").Code)
				storeClk.Advance(time.Minute)
				cfg.Clock = clock.NewManual(t0.Add(skew))
				w := serve(idempotency.New(c, cfg), "b", "x")
				assert.Equal(t, http.StatusServiceUnavailable, w.Code)
				assert.Equal(t, "3540", w.Header().Get("Retry-After"), "59 minutes until the record of a expires, on the store's clock")
			})
		}
	})
}

// TestContent checks what of a request the middleware compares under
// its key, and the bodies it refuses before the store.
func TestContent(t *testing.T) {
	// A body whose member names collide after case folding, or that nests
	// past Config.MaxDepth, is a 400 before the key is looked at: the
	// handler does not run, nothing is stored, and a record the key already
	// has is left alone.
	t.Run("JSON without one reading is refused before the store", func(t *testing.T) {
		t.Parallel()
		store := &idempotency.MemoryStore{}
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, MaxDepth: 3})
		for _, body := range []string{`{"amount":1500,"AMOUNT":2000}`, `{"a":[[[1]]]}`} {
			w := serve(m, "fresh", body)
			assert.Equal(t, http.StatusBadRequest, w.Code, body)
			assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
			assert.Contains(t, w.Body.String(), idempotency.TypeBadRequest)
		}
		require.Equal(t, 201, serve(m, "used", `{"amount":1500}`).Code)
		w := serve(m, "used", `{"amount":1500,"Amount":1500}`)
		assert.Equal(t, http.StatusBadRequest, w.Code, "refused even when the key has a record")
		assert.Equal(t, int32(1), c.runs.Load())
		records, _, _ := store.Count(context.Background())
		assert.Equal(t, 1, records)
		assert.Equal(t, 201, serve(m, "fresh", `{"a":[[1]]}`).Code, "the key stays free; three levels are allowed")
	})

	// A body that ends before its declared length never arrived whole. Over
	// HTTP/2 a client may send the head and an early end of stream. The
	// answer is 408, which asks for it again, never a final 400: the key
	// may hold a record that a whole retry replays.
	t.Run("a body that ends early asks for the request again", func(t *testing.T) {
		t.Parallel()
		store := &idempotency.MemoryStore{}
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store})
		require.Equal(t, 201, serve(m, "used", `{"amount":1500}`).Code)
		for _, key := range []string{"used", "fresh"} {
			r := httptest.NewRequest(http.MethodPost, "/things", io.MultiReader(strings.NewReader(`{"amo`), iotest.ErrReader(io.ErrUnexpectedEOF)))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			m.ServeHTTP(w, r)
			assert.Equal(t, http.StatusRequestTimeout, w.Code, key)
			assert.Equal(t, idempotency.TypeRequestIncomplete, decodeProblem(t, w).Type)
		}
		assert.Equal(t, int32(1), c.runs.Load())
		assert.Equal(t, 201, serve(m, "fresh", `{"amount":1500}`).Code, "the key stays free")
		replay := serve(m, "used", `{"amount":1500}`)
		assert.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed), "a whole retry replays")
	})

	// A key reused with another query is 422 (a handler that reads the query
	// would otherwise get another request's answer); the same parameters in
	// another order replay.
	t.Run("the query is part of the content", func(t *testing.T) {
		t.Parallel()
		store := &idempotency.MemoryStore{}
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, Clock: clock.NewManual(t0)})

		require.Equal(t, 201, serveURL(m, "/things?param1=a&param2=b", "k1", "x").Code)
		reused := serveURL(m, "/things?param1=a&param2=c", "k1", "x")
		assert.Equal(t, http.StatusUnprocessableEntity, reused.Code)
		assert.Contains(t, reused.Body.String(), idempotency.TypeKeyReused)
		reordered := serveURL(m, "/things?param2=b&param1=a", "k1", "x")
		assert.Equal(t, 201, reordered.Code)
		assert.Equal(t, "true", reordered.Header().Get(idempotency.HeaderReplayed))
		assert.Equal(t, int32(1), c.runs.Load())
	})

	// A body is fingerprinted as its handler reads it, after its
	// Content-Encoding is undone, so a retry compressed again (another time
	// in the gzip header, another level) is the same request; what cannot be
	// decoded is refused and stores nothing.
	t.Run("the fingerprint is of what the request means", func(t *testing.T) {
		t.Parallel()
		const payment = `{"amount":1500,"currency":"AZN"}`
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		newHandler := func() (*counter, http.Handler) {
			c := &counter{status: 201}
			return c, idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
		}
		t.Run("a gzip retry compressed again with another header time replays", func(t *testing.T) {
			t.Parallel()
			c, h := newHandler()
			first := serveWith(h, "k", gzipped(t, payment, t0, gzip.BestSpeed), "Content-Encoding", "gzip")
			retry := serveWith(h, "k", gzipped(t, payment, t0.Add(3*time.Second), gzip.BestCompression), "Content-Encoding", "gzip")
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			require.Equal(t, http.StatusCreated, retry.Code, "not 422: %s", retry.Body.String())
			assert.Equal(t, "true", retry.Header().Get(idempotency.HeaderReplayed))
			assert.EqualValues(t, 1, c.runs.Load())
		})
		t.Run("the same body plain, gzip, deflate or stacked is one request", func(t *testing.T) {
			t.Parallel()
			c, h := newHandler()
			require.Equal(t, http.StatusCreated, serveWith(h, "k", []byte(payment)).Code)
			for _, tt := range []struct {
				body   []byte
				fields []string
			}{
				{gzipped(t, payment, t0, gzip.DefaultCompression), []string{"Content-Encoding", "x-gzip"}},
				{deflated(t, []byte(payment)), []string{"Content-Encoding", "Deflate"}},
				{[]byte(payment), []string{"Content-Encoding", "identity"}},
				// Applied in the order listed: deflate first, then gzip.
				{gzipped(t, string(deflated(t, []byte(payment))), t0, gzip.BestSpeed), []string{"Content-Encoding", "deflate, gzip"}},
				{gzipped(t, string(deflated(t, []byte(payment))), t0, gzip.BestSpeed), []string{"Content-Encoding", "deflate", "Content-Encoding", "gzip"}},
			} {
				w := serveWith(h, "k", tt.body, tt.fields...)
				assert.Equal(t, http.StatusCreated, w.Code, "%v: %s", tt.fields, w.Body.String())
				assert.Equal(t, "true", w.Header().Get(idempotency.HeaderReplayed), "%v", tt.fields)
			}
			assert.EqualValues(t, 1, c.runs.Load())
		})
		t.Run("the handler reads the decoded body without its Content-Encoding", func(t *testing.T) {
			t.Parallel()
			h := idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				assert.NoError(t, err)
				assert.Equal(t, payment, string(b))
				assert.Empty(t, r.Header.Get("Content-Encoding"))
				assert.EqualValues(t, len(payment), r.ContentLength)
				w.WriteHeader(http.StatusCreated)
			}), idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{},
				Validate: func(r *http.Request, body []byte) (any, *idempotency.Problem) {
					assert.Equal(t, payment, string(body), "Validate gets the decoded body")
					return nil, nil
				}})
			assert.Equal(t, http.StatusCreated, serveWith(h, "k", gzipped(t, payment, t0, gzip.BestSpeed), "Content-Encoding", "gzip").Code)
		})
		t.Run("an unknown encoding is a clear 415 and the key stays free", func(t *testing.T) {
			t.Parallel()
			c, h := newHandler()
			for _, ce := range []string{"br", "gzip, zstd", "compress", "gzip, gzip, gzip"} {
				w := serveWith(h, "k", gzipped(t, payment, t0, gzip.BestSpeed), "Content-Encoding", ce)
				require.Equal(t, http.StatusUnsupportedMediaType, w.Code, ce)
				assert.Equal(t, idempotency.TypeUnsupportedMediaType, decodeProblem(t, w).Type, ce)
				assert.Equal(t, "gzip, deflate", w.Header().Get("Accept-Encoding"), ce)
			}
			assert.Equal(t, http.StatusCreated, serveWith(h, "k", gzipped(t, payment, t0, gzip.BestSpeed), "Content-Encoding", "gzip").Code)
			assert.EqualValues(t, 1, c.runs.Load())
		})
		t.Run("a body that decodes past the bound is a clear 413, decoded no further", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			// 16 MiB of zeros, sent as about 16 KiB: the decoding stops at the
			// 1 MiB bound, so the request costs a few MiB, not the whole.
			bomb := gzipped(t, `"`+strings.Repeat("0", 16<<20)+`"`, t0, gzip.BestCompression)
			require.Less(t, len(bomb), 1<<20, "the compressed body is within the bound")
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			w := serveWith(h, "k", bomb, "Content-Encoding", "gzip")
			runtime.ReadMemStats(&after)
			require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
			assert.Contains(t, decodeProblem(t, w).Detail, "decodes to more than 1048576 bytes")
			assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8<<20), "bytes allocated to refuse the body")
			assert.Zero(t, c.runs.Load())
		})
		t.Run("a body that is not what its encoding says is a clear 400", func(t *testing.T) {
			t.Parallel()
			c, h := newHandler()
			whole := gzipped(t, payment, t0, gzip.BestSpeed)
			for _, b := range [][]byte{[]byte(payment), whole[:len(whole)-4], append(whole, "junk"...)} {
				w := serveWith(h, "k", b, "Content-Encoding", "gzip")
				require.Equal(t, http.StatusBadRequest, w.Code, "%q", b)
				assert.Equal(t, idempotency.TypeBadRequest, decodeProblem(t, w).Type)
			}
			w := serveWith(h, "k", []byte(payment), "Content-Encoding", "deflate")
			require.Equal(t, http.StatusBadRequest, w.Code)
			assert.Zero(t, c.runs.Load())
		})
	})

	// A JSON body is UTF-8 (RFC 8259). One declared in another charset, with
	// bytes that are not UTF-8, or with a surrogate escape without its other
	// half is refused with a clear 4xx, so that two bodies a client tells
	// apart never share a fingerprint; nothing is stored and the key stays
	// free.
	t.Run("JSON is UTF-8 or refused with a 4xx", func(t *testing.T) {
		t.Parallel()
		const payment = `{"amount":1500,"note":"café"}`
		t.Run("a JSON body declared in another charset is a clear 415", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			for _, tt := range []struct{ ct, body string }{
				{"application/json; charset=iso-8859-1", payment},
				{"application/json; charset=ISO-8859-1", `{"amount":1500}`},
				{`application/json; charset="windows-1252"`, payment},
				{"application/json; charset=utf-16", "\x00{\x00}"},
				{"application/merge-patch+json; charset=latin1", payment},
				{"text/plain; charset=iso-8859-1", payment},
				{"application/json; charset=latin1; charset=utf-8", payment},
			} {
				w := serveWith(h, "k", []byte(tt.body), "Content-Type", tt.ct)
				require.Equal(t, http.StatusUnsupportedMediaType, w.Code, "%s: %s", tt.ct, w.Body.String())
				p := decodeProblem(t, w)
				assert.Equal(t, idempotency.TypeUnsupportedMediaType, p.Type)
				assert.Contains(t, p.Detail, "UTF-8")
			}
			assert.Zero(t, c.runs.Load())
			assert.Equal(t, http.StatusCreated, serveWith(h, "k", []byte(payment), "Content-Type", "application/json").Code, "the key stays free")
		})
		t.Run("UTF-8 declared in any spelling, or no charset, is taken", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			for _, ct := range []string{"application/json", "application/json; charset=utf-8", `application/json;charset="UTF-8"`, "application/json; v=2"} {
				w := serveWith(h, "k", []byte(payment), "Content-Type", ct)
				assert.Equal(t, http.StatusCreated, w.Code, "%s: %s", ct, w.Body.String())
			}
			assert.EqualValues(t, 1, c.runs.Load())
		})
		t.Run("a body that is not JSON is taken whatever its charset", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			a := serveWith(h, "k", []byte("note=caf\xe9"), "Content-Type", "application/x-www-form-urlencoded; charset=iso-8859-1")
			b := serveWith(h, "k", []byte("note=caf\xea"), "Content-Type", "application/x-www-form-urlencoded; charset=iso-8859-1")
			assert.Equal(t, http.StatusCreated, a.Code)
			assert.Equal(t, http.StatusUnprocessableEntity, b.Code, "another body under the key")
		})
		t.Run("text that encoding/json would read as U+FFFD is a clear 400", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			for _, body := range []string{`{"note":"\ud800"}`, `{"note":"\udbff"}`, "{\"note\":\"\xff\"}", "{\"note\":\"\xfe\"}", `{"note":"\udc00\ud800"}`} {
				w := serveWith(h, "k", []byte(body), "Content-Type", "application/json")
				require.Equal(t, http.StatusBadRequest, w.Code, "%q: %s", body, w.Body.String())
				p := decodeProblem(t, w)
				assert.Equal(t, idempotency.TypeBadRequest, p.Type)
				assert.Contains(t, p.Detail, "not UTF-8")
			}
			assert.Zero(t, c.runs.Load())
			assert.Equal(t, http.StatusCreated, serveWith(h, "k", []byte(`{"note":"\ud83d\ude00"}`)).Code, "the key stays free")
			assert.Equal(t, "true", serveWith(h, "k", []byte(`{"note":"😀"}`)).Header().Get(idempotency.HeaderReplayed),
				"a pair of surrogate escapes is the character it encodes")
		})
	})
}

// TestStoreFailure checks the answers when the store fails: retryable,
// never the handler's answer, never the store's own words.
func TestStoreFailure(t *testing.T) {
	// A store with no room answers a new key 503 (an unknown outcome a
	// client retries) with the time until a record expires as Retry-After;
	// the handler does not run and the key stays unused, so the retry after
	// that time does the work once.
	t.Run("a full store is retryable and stores nothing", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(t0)
		store := &idempotency.MemoryStore{MaxRecords: 1}
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store, Clock: clk, Retention: time.Hour})
		require.Equal(t, 201, serve(m, "a", "x").Code)

		clk.Advance(time.Minute)
		w := serve(m, "b", "x")
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		assert.Contains(t, w.Body.String(), idempotency.TypeStorageFull)
		assert.Equal(t, "3540", w.Header().Get("Retry-After"), "59 minutes until the record of a expires")
		assert.Equal(t, int32(1), c.runs.Load(), "the handler did not run")
		assert.Equal(t, "true", serve(m, "a", "x").Header().Get(idempotency.HeaderReplayed), "held keys still replay")

		clk.Advance(59 * time.Minute)
		assert.Equal(t, 201, serve(m, "b", "x").Code)
		assert.Equal(t, int32(2), c.runs.Load())
		assert.Equal(t, int32(2), c.effects.Load())
	})

	// When the store fails, the client gets a 500 problem that says nothing
	// internal (no database message, no index or table name); the error goes
	// to Config.Logger.
	t.Run("the store's error text is logged and never shown", func(t *testing.T) {
		t.Parallel()
		secret := `pgstore: insert key "k": ERROR: duplicate key value violates unique constraint "idempotency_records_pkey" (SQLSTATE 23505)`
		var logged strings.Builder
		logger := slog.New(slog.NewTextHandler(&logged, nil))
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: failingStore{&idempotency.MemoryStore{}, errors.New(secret)}, Logger: logger})
		w := serve(m, "k", "x")
		assert.Equal(t, http.StatusInternalServerError, w.Code)
		assert.Contains(t, w.Body.String(), idempotency.TypeInternal)
		for _, internal := range []string{"pgstore", "SQLSTATE", "idempotency_records", "duplicate key"} {
			assert.NotContains(t, w.Body.String(), internal)
		}
		assert.Contains(t, logged.String(), "SQLSTATE 23505", "the error is logged")
		assert.Zero(t, c.runs.Load())
	})

	// A store call that gets no answer within the store's bound is a 503
	// with Retry-After, never the handler's answer. Before the handler, the
	// handler does not run; after it (a commit that got no answer, and
	// committed), the retry replays the stored answer.
	t.Run("a store without an answer is a 503", func(t *testing.T) {
		t.Parallel()
		t.Run("an insert without answer: the handler does not run", func(t *testing.T) {
			c := &counter{status: 201}
			m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: unansweredStore{&idempotency.MemoryStore{}, true}})
			w := serve(m, "k", "x")
			assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
			assert.Equal(t, "1", w.Header().Get("Retry-After"))
			assert.Zero(t, c.runs.Load())
		})
		t.Run("a commit without answer: 503, and the retry replays what committed", func(t *testing.T) {
			c := &counter{status: 201}
			mem := &idempotency.MemoryStore{}
			m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: unansweredStore{mem, false}})
			w := serve(m, "k", "x")
			assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
			assert.Equal(t, "1", w.Header().Get("Retry-After"))
			assert.NotContains(t, w.Body.String(), "done", "the handler's answer went out")
			w = serve(idempotency.New(c, idempotency.Config{Principal: anyone, Store: mem}), "k", "x")
			assert.Equal(t, 201, w.Code)
			assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
			assert.EqualValues(t, 1, c.runs.Load())
		})
	})

	// A store past its bound and a store that cannot decide (ErrUnavailable:
	// a standby, a database refusing writes, a transaction rolled back on a
	// conflict) get one answer, 503 with Retry-After, whose detail says
	// which without claiming what the store does not know.
	t.Run("a store that cannot settle is a 503", func(t *testing.T) {
		t.Parallel()
		problem := func(t *testing.T, w *httptest.ResponseRecorder) idempotency.Problem {
			t.Helper()
			require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
			assert.Equal(t, "1", w.Header().Get("Retry-After"))
			var p idempotency.Problem
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			return p
		}
		late := problem(t, serve(idempotency.New(&counter{status: 201},
			idempotency.Config{Principal: anyone, Store: unansweredStore{&idempotency.MemoryStore{}, true}}), "k", "x"))
		c := &counter{status: 201}
		conflict := problem(t, serve(idempotency.New(c,
			idempotency.Config{Principal: anyone, Store: conflictedStore{&idempotency.MemoryStore{}}}), "k", "x"))

		t.Run("both are one answer", func(t *testing.T) {
			assert.Equal(t, late.Type, conflict.Type)
			assert.Equal(t, late.Title, conflict.Title)
			assert.Equal(t, late.Status, conflict.Status)
		})
		t.Run("a store past its bound says the database did not answer", func(t *testing.T) {
			assert.Equal(t, "the server's database did not answer in time; retry with the same key after the Retry-After delay", late.Detail)
		})
		t.Run("a conflict after the handler ran is not called a standby, nor nothing done", func(t *testing.T) {
			require.EqualValues(t, 1, c.runs.Load())
			assert.Equal(t, "the server's database could not complete this request now; retry with the same key after the Retry-After delay", conflict.Detail)
		})
	})
}

// failingStore fails every Insert with err, as a database does when a
// statement times out or a table is gone.
type failingStore struct {
	idempotency.Store
	err error
}

func (s failingStore) Insert(context.Context, *idempotency.Record) (*idempotency.Record, bool, error) {
	return nil, false, s.err
}

// TestNew checks the configurations New refuses.
func TestNew(t *testing.T) {
	// There is no default scope. A default that read the Authorization
	// header would make a refreshed token another caller, whose retry finds
	// no record and runs the work again; so New refuses a Config without
	// Principal, and the scope is whatever account Principal returns.
	t.Run("the principal is required", func(t *testing.T) {
		t.Parallel()
		assert.PanicsWithValue(t, "idempotency: Config.Principal is nil: return the account the request acts for, "+
			"as the server's authentication found it, not its credential (a refreshed token must be the same caller)",
			func() {
				idempotency.New(&counter{status: 201}, idempotency.Config{Store: &idempotency.MemoryStore{}})
			})

		account := func(r *http.Request) string { return strings.SplitN(r.Header.Get("Authorization"), ".", 2)[0] }
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Store: &idempotency.MemoryStore{}, Principal: account})
		send := func(auth string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader("x"))
			r.Header.Set(idempotency.HeaderKey, "k")
			r.Header.Set("Authorization", auth)
			w := httptest.NewRecorder()
			m.ServeHTTP(w, r)
			return w
		}
		require.Equal(t, 201, send("acct1.token-before-refresh").Code)
		again := send("acct1.token-after-refresh")
		assert.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "the same account, another token: a replay")
		assert.Empty(t, send("acct2.token").Header().Get(idempotency.HeaderReplayed), "another account has its own key")
		assert.Equal(t, int32(2), c.runs.Load())
	})

	// A record that expires while its worker still holds the lease would be
	// replaced by the next request with its key, under a new stable id: the
	// work would run twice. A retention no longer than the lease is refused.
	t.Run("a retention no longer than the lease is refused", func(t *testing.T) {
		t.Parallel()
		store := &idempotency.MemoryStore{}
		for _, cfg := range []idempotency.Config{
			{Store: store, Principal: anyone, Retention: 10 * time.Second},
			{Store: store, Principal: anyone, Retention: time.Minute, Lease: time.Minute},
			{Store: store, Principal: anyone, Lease: 25 * time.Hour},
		} {
			assert.PanicsWithValue(t, fmt.Sprintf("idempotency: Config.Retention (%s) must be longer than Config.Lease (%s)",
				cmp.Or(cfg.Retention, idempotency.DefaultRetention), cmp.Or(cfg.Lease, idempotency.DefaultLease)),
				func() { idempotency.New(&counter{status: 201}, cfg) })
		}
		assert.NotPanics(t, func() {
			idempotency.New(&counter{status: 201}, idempotency.Config{Principal: anyone, Store: store, Retention: time.Minute})
		})
	})
}

func serveURL(h http.Handler, target, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// endedLeaseTxStore is a TxStore whose RunOnce returns the key's record,
// a lease-mode one whose lease has ended, without taking it over or
// running the work, as if the record changed under it. Its MemoryStore
// holds that record, so a TakeOver outside RunOnce would succeed.
type endedLeaseTxStore struct {
	*idempotency.MemoryStore
}

func (s endedLeaseTxStore) Get(ctx context.Context, id idempotency.ID, now time.Time) (*idempotency.Record, bool, error) {
	rec, _, err := s.Insert(ctx, &idempotency.Record{ID: id, ExpiresAt: now}) // reads the live record
	return rec, rec != nil, err
}

func (s endedLeaseTxStore) RunOnce(ctx context.Context, rec *idempotency.Record,
	_ func(ctx context.Context, abandoned *idempotency.Record) (*idempotency.Response, error)) (*idempotency.Record, error) {
	existing, _, err := s.Insert(ctx, &idempotency.Record{ID: rec.ID, ExpiresAt: rec.CreatedAt})
	return existing, err
}

// TestOneTransaction checks the mode that runs the work in the store's
// transaction.
func TestOneTransaction(t *testing.T) {
	// In the single-transaction mode, a lease-mode record of the request's
	// content whose lease has ended, which RunOnce returned rather than took
	// over, is 409: the middleware does not take it over itself, since the
	// handler would run without its transaction.
	t.Run("the work never runs outside RunOnce", func(t *testing.T) {
		t.Parallel()
		mem := &idempotency.MemoryStore{Clock: clock.NewManual(t0)}
		fp, err := idempotency.NewFingerprint(http.MethodPost, "/things", "", []byte("x"), 0)
		require.NoError(t, err)
		_, inserted, err := mem.Insert(context.Background(), &idempotency.Record{ID: idempotency.ID{Key: "k"}, Fingerprint: fp,
			FingerprintVersion: idempotency.FingerprintVersion, Status: idempotency.StatusInProgress, StableID: "st", Owner: "dead",
			LockedUntil: t0.Add(-time.Second), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)})
		require.NoError(t, err)
		require.True(t, inserted)
		c := &counter{status: 201}
		m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: endedLeaseTxStore{mem}, Clock: clock.NewManual(t0),
			OneTransaction: true})
		w := serveURL(m, "/things", "k", "x")
		assert.Equal(t, http.StatusConflict, w.Code, w.Body.String())
		assert.Zero(t, c.runs.Load(), "the handler ran outside RunOnce")
	})
}

// TestKeyedAnswer checks the answers to a request with a key: one record
// per key, each answer marked, each stored answer bounded.
func TestKeyedAnswer(t *testing.T) {
	// With RequireUUID a key is compared by its canonical form, so an
	// upper-case UUID and its lower-cased retry are one record and one
	// execution; without it keys are compared byte for byte. The echo is the
	// key as each request sent it.
	t.Run("one key is one record", func(t *testing.T) {
		t.Parallel()
		const upper, lower = "8E03978E-40D5-43E8-BC93-6894A57F9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"
		t.Run("in UUID mode a key and its lower-cased retry are one key", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}, RequireUUID: true})
			first, retry := serve(h, upper, "a"), serve(h, lower, "a")
			require.Equal(t, http.StatusCreated, first.Code)
			require.Equal(t, http.StatusCreated, retry.Code)
			assert.Equal(t, "true", retry.Header().Get(idempotency.HeaderReplayed))
			assert.EqualValues(t, 1, c.runs.Load(), "one execution")
			assert.EqualValues(t, 1, c.effects.Load(), "one effect")
			assert.Equal(t, upper, first.Header().Get(idempotency.HeaderKey), "the echo is the key as received")
			assert.Equal(t, lower, retry.Header().Get(idempotency.HeaderKey), "the echo is the key as received")
		})
		t.Run("in any-key mode keys are compared byte for byte", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			first, second := serve(h, upper, "a"), serve(h, lower, "a")
			require.Equal(t, http.StatusCreated, first.Code)
			require.Equal(t, http.StatusCreated, second.Code)
			assert.Empty(t, second.Header().Get(idempotency.HeaderReplayed))
			assert.EqualValues(t, 2, c.runs.Load(), "two keys, two executions")
		})
	})

	// The middleware marks each of its answers with the key as received, so
	// a client can tell them from a proxy's: fresh, replayed, in progress,
	// reused, invalid, a server error.
	t.Run("every answer echoes the key", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name   string
			key    string
			prep   func(h http.Handler) // requests made before the one checked
			status int
			block  bool
			body   string
			handle int
		}{
			{name: "fresh", key: "k-fresh", status: 201, handle: 201},
			{name: "quoted as received", key: `"k-quoted"`, status: 201, handle: 201},
			{name: "replayed", key: "k-replay", status: 201, handle: 201,
				prep: func(h http.Handler) { serve(h, "k-replay", "a") }},
			{name: "reused", key: "k-reuse", status: 422, handle: 201,
				prep: func(h http.Handler) { serve(h, "k-reuse", "other") }},
			{name: "invalid key", key: "k\x01bad", status: 400, handle: 201},
			{name: "server error", key: "k-500", status: 500, handle: 500},
			{name: "business outcome", key: "k-402", status: 402, handle: 402},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				h := idempotency.New(&counter{status: tt.handle}, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
				if tt.prep != nil {
					tt.prep(h)
				}
				w := serve(h, tt.key, "a")
				require.Equal(t, tt.status, w.Code)
				assert.Equal(t, []string{tt.key}, w.Header().Values(idempotency.HeaderKey))
			})
		}
		t.Run("in progress", func(t *testing.T) {
			t.Parallel()
			c := &counter{status: 201, block: make(chan struct{})}
			h := idempotency.New(c, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			done := make(chan struct{})
			go func() { defer close(done); serve(h, "k-409", "a") }()
			require.Eventually(t, func() bool { return c.runs.Load() == 1 }, 5*time.Second, time.Millisecond)
			w := serve(h, "k-409", "a")
			close(c.block)
			<-done
			require.Equal(t, http.StatusConflict, w.Code)
			assert.Equal(t, "k-409", w.Header().Get(idempotency.HeaderKey))
		})
		t.Run("no key, no echo", func(t *testing.T) {
			t.Parallel()
			h := idempotency.New(&counter{status: 201}, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
			w := serve(h, "", "a")
			require.Equal(t, http.StatusBadRequest, w.Code)
			assert.Empty(t, w.Header().Values(idempotency.HeaderKey))
		})
	})

	// An answer over MaxStoredBodyBytes, or to a request Confidential names,
	// is sent whole to its request, and its record is COMPLETED with the
	// status, Location and Content-Type but no body: the replay gives that
	// status, marked with Idempotent-Body-Omitted, and the work never runs
	// again.
	t.Run("a stored answer is bounded and never keeps a secret", func(t *testing.T) {
		t.Parallel()
		const secret = "sk_live_4242424242424242"
		handler := func(runs *atomic.Int32) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Location", "/keys/1")
				w.WriteHeader(http.StatusCreated)
				if r.URL.Path == "/big" {
					_, _ = w.Write([]byte(`{"pad":"` + strings.Repeat("x", idempotency.DefaultMaxStoredBodyBytes) + `"}`))
					return
				}
				_, _ = w.Write([]byte(`{"key":"` + secret + `"}`))
			})
		}
		post := func(h http.Handler, path string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, path, strings.NewReader("a"))
			r.Header.Set(idempotency.HeaderKey, "k")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		for _, tt := range []struct {
			name, path, omitted string
		}{
			{"an answer over the bound is sent whole and its replay says it was not kept", "/big", "too-large"},
			{"a confidential answer is sent whole and never kept at rest", "/keys", "confidential"},
			{"an answer within the bound is kept and replayed whole", "/small", ""},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				var runs atomic.Int32
				store := &idempotency.MemoryStore{}
				h := idempotency.New(handler(&runs), idempotency.Config{Principal: anyone, Store: store,
					Confidential: func(r *http.Request) bool { return r.URL.Path == "/keys" }})
				first := post(h, tt.path)
				require.Equal(t, http.StatusCreated, first.Code)
				assert.Empty(t, first.Header().Get(idempotency.HeaderBodyOmitted), "a fresh answer is whole")
				if tt.path == "/big" {
					assert.Greater(t, first.Body.Len(), idempotency.DefaultMaxStoredBodyBytes)
				} else {
					assert.Contains(t, first.Body.String(), secret)
				}

				at := idempotency.MemoryAtRest(store)
				assert.Contains(t, at, "COMPLETED")
				assert.Contains(t, at, "/keys/1", "the Location is kept")
				if tt.omitted != "" {
					assert.NotContains(t, at, secret)
					assert.NotContains(t, at, "xxxxxxxx")
				}

				replay := post(h, tt.path)
				assert.EqualValues(t, 1, runs.Load(), "the key is never freed: the work runs once")
				require.Equal(t, http.StatusCreated, replay.Code)
				assert.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed))
				assert.Equal(t, "/keys/1", replay.Header().Get("Location"))
				assert.Equal(t, "application/json", replay.Header().Get("Content-Type"))
				assert.Equal(t, tt.omitted, replay.Header().Get(idempotency.HeaderBodyOmitted))
				if tt.omitted != "" {
					assert.Empty(t, replay.Body.String())
					assert.Equal(t, "0", replay.Header().Get("Content-Length"))
				} else {
					assert.Equal(t, first.Body.String(), replay.Body.String())
				}
			})
		}
		t.Run("the bound is the Config's", func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			h := idempotency.New(handler(&runs), idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}, MaxStoredBodyBytes: 16})
			post(h, "/small")
			replay := post(h, "/small")
			assert.Equal(t, "too-large", replay.Header().Get(idempotency.HeaderBodyOmitted))
			assert.EqualValues(t, 1, runs.Load())
		})
	})
}

// serveWith sends body under key with the header fields of h (name,
// value, name, value...).
func serveWith(h http.Handler, key string, body []byte, fields ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/things", bytes.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, key)
	for i := 0; i+1 < len(fields); i += 2 {
		r.Header.Add(fields[i], fields[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// gzipped compresses b as gzip, its header stamped with mod.
func gzipped(t *testing.T, b string, mod time.Time, level int) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, level)
	require.NoError(t, err)
	zw.ModTime = mod
	_, err = zw.Write([]byte(b))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// deflated compresses b as HTTP's deflate (zlib).
func deflated(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zlib.NewWriter(&buf)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// decodeProblem decodes the problem answer w holds.
func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) idempotency.Problem {
	t.Helper()
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"), w.Body.String())
	var p idempotency.Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	return p
}

// unansweredStore is a MemoryStore whose Insert or Complete gets no
// answer within its bound, as pgstore's does when the database stops
// answering: the error matches context.DeadlineExceeded. A Complete with
// no answer has committed.
type unansweredStore struct {
	*idempotency.MemoryStore
	insert bool
}

func (s unansweredStore) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	if s.insert {
		return nil, false, fmt.Errorf("no answer from the database within 2s: %w", context.DeadlineExceeded)
	}
	return s.MemoryStore.Insert(ctx, rec)
}

func (s unansweredStore) Complete(ctx context.Context, id idempotency.ID, owner string, resp *idempotency.Response, commit func(context.Context) error) error {
	if err := s.MemoryStore.Complete(ctx, id, owner, resp, commit); err != nil {
		return err
	}
	return fmt.Errorf("commit: no answer from the database within 10s: %w", context.DeadlineExceeded)
}

// conflictedStore is a MemoryStore whose Complete runs the effect, then
// fails as pgstore's does when the database rolls the transaction back on
// a conflict with another (a serialization failure): nothing committed,
// and the error matches ErrUnavailable.
type conflictedStore struct{ *idempotency.MemoryStore }

func (s conflictedStore) Complete(ctx context.Context, _ idempotency.ID, _ string, _ *idempotency.Response, commit func(context.Context) error) error {
	if commit != nil {
		if err := commit(ctx); err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: the transaction was rolled back on a conflict with another (SQLSTATE 40001)", idempotency.ErrUnavailable)
}
