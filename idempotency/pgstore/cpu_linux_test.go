package pgstore

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter returns a reading of the CPU time spent so far by this process
// and by the PostgreSQL server behind pool (its postmaster and every
// process it started), or nil when the server's processes cannot be read
// (another host, another user's /proc). A benchmark reports the
// differences per request: on a loaded machine CPU time moves much less
// than wall time.
func cpuMeter(pool *pgxpool.Pool) func() (self, server time.Duration) {
	var backend int
	if err := pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return nil
	}
	postmaster, _, ok := procStat(backend)
	if !ok {
		return nil
	}
	return func() (time.Duration, time.Duration) {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		self := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		_, server, _ := procStat(postmaster)
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if ppid, cpu, ok := procStat(pid); ok && ppid == postmaster {
				server += cpu
			}
		}
		return self, server
	}
}

// procStat reads the parent and the CPU time (user and system) of process
// pid from /proc.
func procStat(pid int) (ppid int, cpu time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, 0, false
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	utime, err2 := strconv.ParseInt(f[11], 10, 64)
	stime, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	// USER_HZ is 100 on every Linux the project runs on.
	return ppid, time.Duration(utime+stime) * 10 * time.Millisecond, true
}
