package fakeserver

import (
	"sync"

	"github.com/idemkit/idem/fakeserver/internal/fakestate"
)

// errDeclined is the provider's answer for the declined test customer.
var errDeclined = fakestate.ErrDeclined

// declinedCustomer is the customer whose card the provider always declines.
const declinedCustomer = fakestate.DeclinedCustomer

// charge is one charge the fake provider made.
type charge = fakestate.Charge

// provider is the fake payment provider outside the server's store. It has
// its own idempotency on the server's stable id: charging one id twice makes
// one charge. It is safe for concurrent use.
type provider struct {
	mu      sync.Mutex
	charges map[string]charge
	made    int // charges made; counted apart from the map so a duplicate would show
}

func newProvider() *provider { return &provider{charges: make(map[string]charge)} }

// Charge charges once per id; a repeated id returns the first charge.
func (p *provider) Charge(c charge) (charge, error) {
	if c.Customer == declinedCustomer {
		return charge{}, errDeclined
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.charges[c.ID]; ok {
		return old, nil
	}
	p.charges[c.ID] = c
	p.made++
	return c, nil
}

// Lookup returns the charge made for id, the status query a server makes
// when it recovers an intent whose worker died.
func (p *provider) Lookup(id string) (charge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.charges[id]
	return c, ok
}

func (p *provider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.made
}

func (p *provider) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.charges)
	p.made = 0
}
