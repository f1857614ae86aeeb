package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
)

// TestStableID checks that every attempt of one key runs under one
// stable id, which a handler passes to its provider.
func TestStableID(t *testing.T) {
	t.Run("a takeover sees the first attempt's stable id", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(t0)
		store := &idempotency.MemoryStore{}
		var infos []idempotency.Info
		var mu sync.Mutex
		crash := true
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			info, ok := idempotency.FromContext(r.Context())
			require.True(t, ok)
			mu.Lock()
			infos = append(infos, info)
			c := crash
			crash = false
			mu.Unlock()
			if c {
				panic(http.ErrAbortHandler)
			}
			w.WriteHeader(201)
		})
		m := idempotency.New(h, idempotency.Config{Principal: anyone, Store: store, Clock: clk})
		assert.PanicsWithValue(t, http.ErrAbortHandler, func() { serve(m, "k", "x") })
		clk.Advance(idempotency.DefaultLease)
		assert.Equal(t, 201, serve(m, "k", "x").Code)
		require.Len(t, infos, 2)
		assert.False(t, infos[0].Takeover)
		assert.True(t, infos[1].Takeover)
		assert.Equal(t, infos[0].StableID, infos[1].StableID)
	})

	// A handler passes the stable id to its provider, whose call times out
	// after the charge was made (or whose record cannot be written after it),
	// and answers 5xx. The stable id is the same on every attempt: the retry
	// must reach the provider under it, or the card is charged twice.
	t.Run("a server error keeps the stable id for the retry", func(t *testing.T) {
		t.Parallel()
		for name, fail := range map[string]func(w http.ResponseWriter, r *http.Request){
			"provider timed out": func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusGatewayTimeout) },
			"record not written": func(w http.ResponseWriter, r *http.Request) {
				_ = idempotency.OnCommit(r.Context(), func(context.Context) error { return errors.New("the database went away") })
				w.WriteHeader(http.StatusCreated)
			},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				var p provider
				var runs atomic.Int32
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					info, _ := idempotency.FromContext(r.Context())
					p.charge(info.StableID)
					if runs.Add(1) == 1 {
						fail(w, r)
						return
					}
					w.WriteHeader(http.StatusCreated)
				})
				m := idempotency.New(h, idempotency.Config{Principal: anyone, Store: &idempotency.MemoryStore{}})
				first := serve(m, "k", `{"amount":1500}`)
				require.GreaterOrEqual(t, first.Code, 500)
				require.Equal(t, http.StatusCreated, serve(m, "k", `{"amount":1500}`).Code)
				assert.Equal(t, 1, p.charges(), "one charge at the provider")
			})
		}
	})
}

// TestOnCommit checks that a handler's effect commits with its record
// and is discarded with it.
func TestOnCommit(t *testing.T) {
	t.Run("the effect commits with the record or is discarded with it", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name        string
			status      int
			nothingDone bool
			effects     int32
			stored      bool
		}{
			{"success commits the effect with the record", 201, false, 1, true},
			{"business outcome is stored", 402, false, 1, true},
			{"server error discards both", 500, true, 0, false},
			{"503 discards both", 503, true, 0, false},
			{"server error keeps the record for a takeover", 500, false, 0, false},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				store := &idempotency.MemoryStore{}
				c := &counter{status: tt.status, nothingDone: tt.nothingDone}
				m := idempotency.New(c, idempotency.Config{Principal: anyone, Store: store})
				first := serve(m, "k", "x")
				assert.Equal(t, tt.status, first.Code)
				assert.Equal(t, tt.effects, c.effects.Load())
				records, inProgress, _ := store.Count(context.Background())
				if !tt.stored && !tt.nothingDone {
					// The handler may have called a provider: the record
					// stays, its lease ended, and the retry takes it over.
					assert.Equal(t, 1, inProgress)
					assert.Equal(t, tt.status, serve(m, "k", "x").Code, "taken over at once")
					assert.Equal(t, int32(2), c.runs.Load())
					return
				}
				assert.Zero(t, inProgress)
				if !tt.stored {
					assert.Zero(t, records)
					return
				}
				assert.Equal(t, 1, records)
				again := serve(m, "k", "x")
				assert.Equal(t, tt.status, again.Code)
				assert.Equal(t, "done", again.Body.String())
				assert.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
				assert.Empty(t, again.Header().Get("X-Not-Stored"), "only what a replay needs is stored")
				assert.Equal(t, int32(1), c.runs.Load())
			})
		}
	})

	t.Run("without the middleware the effect runs at once", func(t *testing.T) {
		t.Parallel()
		c := &counter{status: 201}
		serve(c, "", "")
		assert.Equal(t, int32(1), c.effects.Load())
	})
}

// provider is an external payment provider with its own idempotency on the
// server's stable id, as the package docs ask handlers to use it.
type provider struct {
	mu      sync.Mutex
	charged map[string]bool
}

func (p *provider) charge(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.charged == nil {
		p.charged = make(map[string]bool)
	}
	p.charged[id] = true
}

func (p *provider) charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charged)
}
