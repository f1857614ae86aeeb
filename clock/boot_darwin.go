//go:build darwin

package clock

import (
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// bootID is the boot's time as the kernel keeps it (kern.boottime). That
// time names one boot. It is read once.
var bootID = sync.OnceValue(func() string {
	tv, err := unix.SysctlTimeval("kern.boottime")
	if err != nil {
		return ""
	}
	return strconv.FormatInt(tv.Sec, 10) + "." + strconv.FormatInt(int64(tv.Usec), 10)
})

func sinceBoot() (time.Duration, string, bool) {
	id := bootID()
	if id == "" {
		return 0, "", false
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &ts); err != nil {
		return 0, "", false
	}
	return time.Duration(ts.Nano()), id, true
}
