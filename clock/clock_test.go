package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/clock"
)

func TestManualMovesOnlyWhenTold(t *testing.T) {
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
}
