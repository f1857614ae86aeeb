package fakeserver

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProviderIsIdempotentOnStableID(t *testing.T) {
	t.Parallel()
	p := newProvider()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			_, err := p.Charge(charge{ID: "pay_1", Amount: 100, Customer: "cus_1"})
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.Equal(t, 1, p.count())
	c, ok := p.Lookup("pay_1")
	require.True(t, ok)
	assert.Equal(t, int64(100), c.Amount)

	_, err := p.Charge(charge{ID: "pay_2", Customer: declinedCustomer})
	assert.ErrorIs(t, err, errDeclined)
	_, ok = p.Lookup("pay_2")
	assert.False(t, ok, "a decline is no charge")
	assert.Equal(t, 1, p.count())
}
