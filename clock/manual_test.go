package clock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
)

// Manual models the device's three clocks: device sleep stops the
// monotonic clock only, a jump moves the wall clock only, and a reboot
// restarts the sleep-counting clock under a new identity.
func TestManualModelsSleepJumpsAndReboots(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := clock.NewManual(start)
	b0, id0, ok := c.SinceBoot()
	require.True(t, ok)
	m0 := c.Monotonic()

	c.DeviceSleep(2 * time.Hour)
	b1, id1, _ := c.SinceBoot()
	assert.Equal(t, start.Add(2*time.Hour), c.Now())
	assert.Equal(t, m0, c.Monotonic(), "the monotonic clock stops while the device sleeps")
	assert.Equal(t, 2*time.Hour, b1-b0)
	assert.Equal(t, id0, id1)

	c.Jump(-48 * time.Hour)
	assert.Equal(t, start.Add(-46*time.Hour), c.Now())
	b2, _, _ := c.SinceBoot()
	assert.Equal(t, b1, b2, "a jump moves the wall clock only")

	c.Reboot()
	_, id3, _ := c.SinceBoot()
	assert.NotEqual(t, id0, id3)

	_, _, ok = clock.NewManual(start).WithoutBootClock().SinceBoot()
	assert.False(t, ok)
}
