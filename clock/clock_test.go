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

// noSleepReading is a Clock of an app's own without a reading that counts
// device sleep.
type noSleepReading struct {
	clock.NoBoot
	*clock.Manual
}

// SinceBoot is NoBoot's: Manual's would hide it.
func (c noSleepReading) SinceBoot() (time.Duration, string, bool) { return c.NoBoot.SinceBoot() }

func TestSinceBoot(t *testing.T) {
	t.Run("a clock without a reading that counts sleep says so", func(t *testing.T) {
		var c clock.Clock = noSleepReading{Manual: clock.NewManual(time.Unix(0, 0))}
		if d, boot, ok := c.SinceBoot(); ok || d != 0 || boot != "" {
			t.Errorf("SinceBoot = %v, %q, %v; want no reading", d, boot, ok)
		}
	})
	t.Run("Manual counts the time it moved under one boot", func(t *testing.T) {
		c := clock.NewManual(time.Unix(0, 0))
		d0, boot0, ok := c.SinceBoot()
		if !ok || boot0 == "" {
			t.Fatalf("SinceBoot = %v, %q, %v; want a reading", d0, boot0, ok)
		}
		c.Advance(time.Minute)
		c.Advance(-time.Hour) // the wall clock set back: not the time since boot
		if d, boot, _ := c.SinceBoot(); d-d0 != time.Minute || boot != boot0 {
			t.Errorf("after a minute: %v under %q, want %v under %q", d-d0, boot, time.Minute, boot0)
		}
	})
}
