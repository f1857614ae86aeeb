//go:build linux

package clock

import (
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// bootID is read once, as it never changes while the system runs.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

func sinceBoot() (time.Duration, string, bool) {
	id := bootID()
	if id == "" {
		return 0, "", false
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, "", false
	}
	return time.Duration(ts.Nano()), id, true
}
