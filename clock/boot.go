package clock

import (
	"context"
	"time"
)

// System returns the device's clocks: Now is time.Now, Monotonic counts
// from the process's start on Go's monotonic reading (it stops while the
// device sleeps), and SinceBoot reads a clock that counts device sleep:
// CLOCK_BOOTTIME on Linux and Android, with /proc/sys/kernel/random/boot_id
// as the boot's identity; CLOCK_MONOTONIC_RAW on Darwin and iOS, with
// kern.boottime as the boot's identity. Both are read without cgo. On other
// systems (Windows, the BSDs, js, wasip1), or where the boot's identity
// cannot be read (a sandbox that hides /proc), SinceBoot reports ok false:
// the ages idem judges then rest on the wall clock, the stored high-water
// mark of the wall clock and the monotonic reading within one process, and
// device sleep during a process's life is counted only by the wall clock.
func System() Clock { return systemClock{} }

var processStart = time.Now()

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Monotonic() time.Duration { return time.Since(processStart) }

func (systemClock) SinceBoot() (time.Duration, string, bool) { return sinceBoot() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
