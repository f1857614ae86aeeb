package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
)

// TestManual checks the clock a test moves by hand.
func TestManual(t *testing.T) {
	t.Run("moves only when told", func(t *testing.T) {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		c := clock.NewManual(t0)
		if got := c.Now(); !got.Equal(t0) {
			t.Fatalf("Now = %v, want %v", got, t0)
		}
		c.Advance(time.Minute)
		if err := c.Sleep(context.Background(), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if got, want := c.Now(), t0.Add(time.Minute+2*time.Second); !got.Equal(want) {
			t.Fatalf("Now = %v, want %v", got, want)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.Sleep(ctx, time.Hour); err != context.Canceled {
			t.Fatalf("Sleep on a done context = %v, want context.Canceled", err)
		}
		if got, want := c.Now(), t0.Add(time.Minute+2*time.Second); !got.Equal(want) {
			t.Fatalf("a refused Sleep moved the clock to %v", got)
		}
		if got := c.Sleeps(); len(got) != 1 || got[0] != 2*time.Second {
			t.Fatalf("Sleeps = %v, want [2s]", got)
		}
	})

	// Manual's three readings: Advance moves them all forward, and a
	// negative Advance, a wall clock set back, moves the wall clock only.
	t.Run("Advance moves every reading and a set-back only the wall clock", func(t *testing.T) {
		t.Parallel()
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		c := clock.NewManual(start)
		b0, id0, ok := c.SinceBoot()
		require.True(t, ok)
		m0 := c.Monotonic()

		c.Advance(2 * time.Hour)
		b1, id1, _ := c.SinceBoot()
		assert.Equal(t, start.Add(2*time.Hour), c.Now())
		assert.Equal(t, 2*time.Hour, c.Monotonic()-m0)
		assert.Equal(t, 2*time.Hour, b1-b0)
		assert.Equal(t, id0, id1)

		c.Advance(-48 * time.Hour)
		assert.Equal(t, start.Add(-46*time.Hour), c.Now())
		b2, _, _ := c.SinceBoot()
		assert.Equal(t, b1, b2, "a clock set back moves the wall clock only")
		assert.Equal(t, 2*time.Hour, c.Monotonic()-m0)
	})
}
