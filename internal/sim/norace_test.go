//go:build !race

package sim

// raceEnabled is true in a build with the race detector.
const raceEnabled = false
