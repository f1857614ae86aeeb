//go:build !linux && !darwin

package clock

import "time"

// sinceBoot: no clock that counts device sleep is read on this system.
func sinceBoot() (time.Duration, string, bool) { return 0, "", false }
