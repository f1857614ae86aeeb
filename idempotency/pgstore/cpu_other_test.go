//go:build !linux

package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter reads CPU times on Linux only.
func cpuMeter(*pgxpool.Pool) func() (self, server time.Duration) { return nil }
