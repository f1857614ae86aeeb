package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) storetest.Subject {
		clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		s := &idempotency.MemoryStore{Clock: clk}
		return storetest.Subject{
			Store:  s,
			SetNow: func(t time.Time) { clk.Advance(t.Sub(clk.Now())) },
			AtRest: func(context.Context) (string, error) { return idempotency.MemoryAtRest(s), nil },
		}
	})
}
