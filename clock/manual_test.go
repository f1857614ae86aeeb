package clock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
)

// Manual's three readings: Advance moves them all forward, and a
// negative Advance, a wall clock set back, moves the wall clock only.
func TestManualAdvanceMovesEveryReadingAndASetBackOnlyTheWallClock(t *testing.T) {
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
}
