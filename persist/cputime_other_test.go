//go:build !unix

package persist

// cpuTime returns 0 where getrusage is missing. The metric is then 0.
func cpuTime() int64 { return 0 }
