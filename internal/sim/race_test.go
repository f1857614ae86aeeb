//go:build race

package sim

// raceEnabled is true in a build with the race detector, which slows the
// real parts about fivefold.
const raceEnabled = true
