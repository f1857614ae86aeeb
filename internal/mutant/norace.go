//go:build !race

package mutant

// raceEnabled is true in a build with the race detector.
const raceEnabled = false
