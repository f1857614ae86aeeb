package fakeserver_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/fakeserver"
)

// TestNewHandlerRefusesALeaseNoLongerThanTheProcessingDelay: a payment
// slower than its lease would be taken over by its resend while it runs
// and executed twice for one key, so the constructors refuse the options
// with a panic that says why; a lease longer than the delay is taken.
func TestNewHandlerRefusesALeaseNoLongerThanTheProcessingDelay(t *testing.T) {
	t.Parallel()
	for _, o := range []fakeserver.Options{
		{Lease: time.Second, ProcessingDelay: time.Second},
		{Lease: time.Second, ProcessingDelay: 2 * time.Second},
		{ProcessingDelay: time.Minute}, // the default lease is 30s
	} {
		assert.PanicsWithValue(t, "fakeserver: Lease ("+leaseOrDefault(o.Lease)+") must be longer than ProcessingDelay ("+o.ProcessingDelay.String()+
			"): a payment still running would be taken over by its resend and run twice", func() { fakeserver.NewHandler(&o) })
	}
	assert.NotPanics(t, func() {
		fakeserver.NewHandler(&fakeserver.Options{Lease: 2 * time.Second, ProcessingDelay: time.Second})
	})
}

func leaseOrDefault(d time.Duration) string {
	if d <= 0 {
		return (30 * time.Second).String()
	}
	return d.String()
}
