//go:build unix

package persist

import "syscall"

// cpuTime returns the CPU time the process has used, in nanoseconds. A
// benchmark reports it beside its wall time: a store's background work
// costs a device's battery too.
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
