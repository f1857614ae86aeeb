package fakeserver

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/fakeserver/internal/fakestate"
	"github.com/idemkit/idem/idempotency"
)

// memory is the fake server's state in the process's memory, bounded by
// Options.MaxRecords, MaxPayments and MaxOrders. It never fails.
type memory struct {
	store     *idempotency.MemoryStore
	ledger    *ledger
	provider  *provider
	orders    orders
	maxOrders int

	requests, executions atomic.Int64
}

func newMemory(cfg config) *memory {
	// A nil clock is the system clock, as cfg.now.
	m := &memory{store: &idempotency.MemoryStore{Clock: cfg.clock, MaxRecords: cfg.maxRecords}, ledger: newLedger(),
		provider: newProvider(), orders: orders{status: make(map[idempotency.ID]string)}, maxOrders: cfg.maxOrders}
	m.ledger.max = cfg.maxPayments
	return m
}

func (m *memory) Records() idempotency.Store { return m.store }

func (m *memory) Record(ctx context.Context, id idempotency.ID, now time.Time) (*idempotency.Record, bool, error) {
	rec, ok := m.store.Get(ctx, id, now)
	return rec, ok, nil
}

func (m *memory) Count(_ context.Context, c fakestate.Counter) error {
	switch c {
	case fakestate.Requests:
		m.requests.Add(1)
	case fakestate.Executions:
		m.executions.Add(1)
	}
	return nil
}

// Reserve is the ledger's reservation: room, and what the payment will be.
func (m *memory) Reserve(_ context.Context, id string, in fakestate.Intent, _ time.Time) (bool, error) {
	return m.ledger.reserve(id, in), nil
}

func (m *memory) Intent(_ context.Context, id string) (fakestate.Intent, bool, error) {
	in, ok := m.ledger.reservations(func(_ idempotency.ID, pid string) bool { return pid == id })[id]
	return in, ok, nil
}

func (m *memory) Declined(id string) { m.ledger.unreserve(id) }

func (m *memory) AddPayment(_ context.Context, p *payment) error {
	m.ledger.add(p)
	return nil
}

func (m *memory) Payment(_ context.Context, principal, id string) (*payment, bool, error) {
	p, ok := m.ledger.get(principal, id)
	return p, ok, nil
}

func (m *memory) Payments(_ context.Context, principal string) ([]*payment, error) {
	return m.ledger.list(principal), nil
}

func (m *memory) Charge(_ context.Context, c fakestate.Charge) (fakestate.Charge, error) {
	return m.provider.Charge(c)
}

func (m *memory) LookupCharge(_ context.Context, id string) (fakestate.Charge, bool, error) {
	c, ok := m.provider.Lookup(id)
	return c, ok, nil
}

// Recover records the key's reservations the provider charged, then
// answers the key's latest payment.
func (m *memory) Recover(ctx context.Context, id idempotency.ID) (*payment, bool, error) {
	m.settleReservations(ctx, func(rec idempotency.ID, _ string) bool { return rec == id }, false)
	p, ok := m.ledger.byIdempotencyKey(id.Principal, id.Key)
	return p, ok, nil
}

func (m *memory) SetOrderStatus(_ context.Context, principal, id, status string) (bool, error) {
	return m.orders.set(idempotency.ID{Principal: principal, Key: id}, status, m.maxOrders), nil
}

func (m *memory) Stats(ctx context.Context) (fakestate.Stats, error) {
	records, inProgress, _ := m.store.Count(ctx)
	return fakestate.Stats{
		Payments:        m.ledger.count(),
		ProviderCharges: m.provider.count(),
		Executions:      int(m.executions.Load()),
		Records:         records,
		InProgress:      inProgress,
		Requests:        int(m.requests.Load()),
	}, nil
}

// Sweep deletes the expired records; a payment whose worker died and was
// never taken over is settled as its record goes: recorded if the provider
// charged it, its room freed if not.
func (m *memory) Sweep(ctx context.Context, now time.Time) (int, error) {
	n, err := m.store.Sweep(ctx, now)
	m.settleReservations(ctx, func(id idempotency.ID, stableID string) bool {
		rec, ok := m.store.Get(ctx, id, now)
		return !ok || rec.StableID != stableID
	}, true)
	return n, err
}

// settleReservations records as payments the reservations that pick
// selects whose charge the provider made, and frees the others if free is
// true. It is for reservations no worker can settle any more.
func (m *memory) settleReservations(_ context.Context, pick func(rec idempotency.ID, id string) bool, free bool) {
	for pid, in := range m.ledger.reservations(pick) {
		ch, charged := m.provider.Lookup(pid)
		if charged {
			m.ledger.add(in.Payment(pid, ch))
		} else if free {
			m.ledger.unreserve(pid)
		}
	}
}

func (m *memory) Reset(context.Context) error {
	m.store.Clear()
	m.ledger.reset()
	m.provider.reset()
	m.orders.mu.Lock()
	clear(m.orders.status)
	m.orders.mu.Unlock()
	m.requests.Store(0)
	m.executions.Store(0)
	return nil
}

// ledger is the fake server's business database: the payments made. It is
// safe for concurrent use.
type ledger struct {
	mu    sync.Mutex
	byID  map[string]*payment
	byKey map[idempotency.ID]*payment
	order []*payment
	// max bounds payments made plus reserved; 0 means no bound. Room is
	// reserved for a payment id before the provider charges it, so that a
	// charge is never made for a payment the ledger cannot hold.
	max int
	// reserved holds, by payment id, the payments the provider may be
	// charging: room, and what the payment will be, are held before the
	// provider is asked, so that a charge whose worker died before it was
	// recorded can still be found and recorded (see memory.Recover).
	reserved map[string]fakestate.Intent
	// latest holds, by key, the payment id of the key's latest intent
	// where it is not the key's payment in byKey: a key used again after
	// its retention whose new intent was declined, or is not recorded yet.
	// The lookup answers for it, never for the key's earlier payment. An
	// entry is kept only for a key that has a payment, so there are at
	// most as many as payments.
	latest map[idempotency.ID]string
}

func newLedger() *ledger {
	return &ledger{byID: make(map[string]*payment), byKey: make(map[idempotency.ID]*payment),
		reserved: make(map[string]fakestate.Intent), latest: make(map[idempotency.ID]string)}
}

// reserve holds room for payment id, made under the record rec, and reports
// false if there is none. A payment already made or reserved under id has
// its room (a takeover reuses its dead worker's id).
func (l *ledger) reserve(id string, r fakestate.Intent) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.byID[id]; ok {
		return true
	}
	if _, ok := l.reserved[id]; ok {
		return true
	}
	if l.max > 0 && len(l.order)+len(l.reserved) >= l.max {
		return false
	}
	l.reserved[id] = r
	if p, ok := l.byKey[r.Record]; ok && p.ID != id {
		l.latest[r.Record] = id
	}
	return true
}

// reservations returns the reservations that pick selects, by payment id.
func (l *ledger) reservations(pick func(rec idempotency.ID, id string) bool) map[string]fakestate.Intent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]fakestate.Intent)
	for pid, r := range l.reserved {
		if pick(r.Record, pid) {
			out[pid] = r
		}
	}
	return out
}

func (l *ledger) unreserve(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.reserved, id)
}

func (l *ledger) add(p *payment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.reserved, p.ID)
	if _, dup := l.byID[p.ID]; dup {
		return
	}
	l.byID[p.ID] = p
	if k := (idempotency.ID{Principal: p.Principal, Key: p.Key}); p.Key != "" {
		// A payment of an earlier intent, recovered after the key's new
		// intent was made, is not the key's latest.
		if latest, ok := l.latest[k]; !ok || latest == p.ID {
			l.byKey[k] = p
			delete(l.latest, k)
		}
	}
	l.order = append(l.order, p)
}

func (l *ledger) get(principal, id string) (*payment, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.byID[id]
	if !ok || p.Principal != principal {
		return nil, false
	}
	return p, true
}

func (l *ledger) byIdempotencyKey(principal, key string) (*payment, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := idempotency.ID{Principal: principal, Key: key}
	if _, ok := l.latest[k]; ok {
		return nil, false // the latest intent was not charged, or not yet recorded
	}
	p, ok := l.byKey[k]
	return p, ok
}

func (l *ledger) list(principal string) []*payment {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []*payment{}
	for _, p := range l.order {
		if p.Principal == principal {
			out = append(out, p)
		}
	}
	return out
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.order)
}

func (l *ledger) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.byID)
	clear(l.byKey)
	clear(l.reserved)
	clear(l.latest)
	l.order = nil
}

// orders holds the statuses set with PUT /orders/{id}/status. It is safe for
// concurrent use.
type orders struct {
	mu     sync.Mutex
	status map[idempotency.ID]string
}

// set sets the status of order id and reports true, unless id is a new
// order and limit (if positive) orders are held.
func (o *orders) set(id idempotency.ID, status string, limit int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.status[id]; !ok && limit > 0 && len(o.status) >= limit {
		return false
	}
	o.status[id] = status
	return true
}
