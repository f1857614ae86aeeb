package fakeserver

import (
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem/fakeserver/internal/fakestate"
)

// Charge is one charge the fake provider made, as [Handler.Charges]
// reports it. A charge whose worker died is one too. Its payment may never
// have been recorded.
type Charge struct {
	// ID is the payment's stable id, the provider's idempotency key.
	ID        string
	Amount    int64
	Currency  string
	Customer  string
	CreatedAt time.Time
	// Principal and Key name the record the charge was made under.
	Principal, Key string
	// Description is the payment's description, as the request gave it.
	Description string
}

// ErrChargesNotKept is returned by [Handler.Charges] on [Options.Storage].
// Only the server's memory keeps the charges' requests.
var ErrChargesNotKept = errors.New("fakeserver: the provider's charges are listed only in memory")

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
	order   []string
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
	p.order = append(p.order, c.ID)
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
	p.order = nil
}

// list returns the charges in the order they were made.
func (p *provider) list() []Charge {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Charge, 0, len(p.order))
	for _, id := range p.order {
		c := p.charges[id]
		out = append(out, Charge{ID: c.ID, Amount: c.Amount, Currency: c.Currency, Customer: c.Customer,
			CreatedAt: c.CreatedAt, Principal: c.Record.Principal, Key: c.Record.Key, Description: c.Description})
	}
	return out
}

// Charges returns every charge the fake provider made, in the order made.
// Dead workers' charges are among them. A test checks with it that no
// request was charged twice. It fails with [ErrChargesNotKept] on
// [Options.Storage].
func (h *Handler) Charges() ([]Charge, error) {
	m, ok := h.state.(*memory)
	if !ok {
		return nil, ErrChargesNotKept
	}
	return m.provider.list(), nil
}
