package idempotency_test

import (
	"testing"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) storetest.Subject {
		return storetest.Subject{Store: idempotency.NewMemoryStore()}
	})
}
