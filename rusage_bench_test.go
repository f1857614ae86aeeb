//go:build unix

package idem_test

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time this process has used, user and system.
// A benchmark divides its growth by the payments it made: unlike wall
// time, it does not grow while other processes hold the cores.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
