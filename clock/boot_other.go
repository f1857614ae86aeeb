//go:build !linux && !darwin

package clock

import "time"

// sinceBoot reports no reading: idem reads no sleep-counting clock here.
func sinceBoot() (time.Duration, string, bool) { return 0, "", false }
