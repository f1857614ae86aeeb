//go:build race

package idem_test

// raceEnabled: the race detector instruments the build, and allocation
// counts are not the program's.
const raceEnabled = true
