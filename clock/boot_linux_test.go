//go:build linux

package clock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func monotonic(t *testing.T) time.Duration {
	t.Helper()
	var ts unix.Timespec
	require.NoError(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	return time.Duration(ts.Nano())
}

// TestSystemSinceBoot checks the system's clock that counts sleep.
func TestSystemSinceBoot(t *testing.T) {
	// The system's sleep-counting clock is CLOCK_BOOTTIME: CLOCK_MONOTONIC
	// plus the time the system was suspended, so it never reads less, and it
	// advances at least as much between two readings; the boot's identity
	// stays the same within the boot.
	t.Run("counts everything the monotonic clock counts", func(t *testing.T) {
		t.Parallel()
		sys, ok := System().(interface {
			SinceBoot() (time.Duration, string, bool)
		})
		require.True(t, ok, "the system clock implements Boot")
		m0 := monotonic(t)
		b0, id0, ok := sys.SinceBoot()
		require.True(t, ok, "Linux has CLOCK_BOOTTIME and a boot_id")
		require.NotEmpty(t, id0)
		m1 := monotonic(t)
		assert.GreaterOrEqual(t, b0, m0, "since boot, sleep included, is at least the monotonic reading before it")

		time.Sleep(5 * time.Millisecond)
		m2 := monotonic(t)
		b1, id1, ok := sys.SinceBoot()
		require.True(t, ok)
		assert.Equal(t, id0, id1, "one boot, one identity")
		assert.GreaterOrEqual(t, b1-b0, m2-m1, "it advanced at least as much as the monotonic clock between the readings")
	})
}
