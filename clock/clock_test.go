package clock_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/clock"
)

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
