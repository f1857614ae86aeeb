package clock

import (
	"context"
	"time"
)

// System returns the device's clocks.
//
//   - Now is time.Now.
//   - Monotonic counts from the process's start on Go's monotonic reading.
//     It stops while the device sleeps.
//   - SinceBoot reads a clock that counts device sleep.
//
// On Linux and Android, SinceBoot reads CLOCK_BOOTTIME. There
// /proc/sys/kernel/random/boot_id names the boot. On Darwin and iOS, it
// reads CLOCK_MONOTONIC_RAW. There kern.boottime names the boot. Both are
// read without cgo. On other systems, SinceBoot reports ok false. (Those are
// Windows, the BSDs, js and wasip1.) So it does where the boot's identity
// cannot be read. (A sandbox that hides /proc is such a place.) The ages
// idem judges then rest on the other clocks. Those are the wall clock and
// its stored high-water mark. Within one process, the monotonic reading
// counts too. Only the wall clock then counts device sleep during a
// process's life.
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
