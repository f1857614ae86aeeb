package fakeserver

import (
	"context"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// The handler reaches its state through these methods, which read and write
// memory, or PostgreSQL when [Options.Postgres] is set. Memory never fails;
// the database may, and the error says what was being done.

func (h *Handler) countRequest(ctx context.Context) {
	if h.pg != nil {
		_ = h.pg.count(ctx, "requests") // a lost count is no reason to refuse the request
		return
	}
	h.requests.Add(1)
}

func (h *Handler) countExecution(ctx context.Context) error {
	if h.pg != nil {
		return h.pg.count(ctx, "executions")
	}
	h.executions.Add(1)
	return nil
}

// liveRecord returns the live idempotency record id at now, if any.
func (h *Handler) liveRecord(ctx context.Context, id idempotency.ID, now time.Time) (*idempotency.Record, bool, error) {
	if h.pg != nil {
		return h.pg.store.Get(ctx, id, now)
	}
	rec, ok := h.store.Get(ctx, id, now)
	return rec, ok, nil
}

// reserve holds room for payment id before the provider is asked to charge
// it, and records the intent to charge: what the request asked, under which
// record. In memory it is the ledger's reservation; on PostgreSQL a row of
// fake_intents, which every process on the database finds, so that a
// charge whose process died is never lost (see recoverCharged).
func (h *Handler) reserve(ctx context.Context, id string, r reservation) (bool, error) {
	if h.pg != nil {
		return true, h.pg.addIntent(ctx, id, r, h.cfg.now())
	}
	return h.ledger.reserve(id, r), nil
}

// intent returns the intent to charge under payment id, if one is held.
func (h *Handler) intent(ctx context.Context, id string) (reservation, bool, error) {
	if h.pg != nil {
		return h.pg.intent(ctx, id)
	}
	r, ok := h.ledger.reservations(func(_ idempotency.ID, pid string) bool { return pid == id })[id]
	return r, ok, nil
}

// addPayment stores p; called from the request's commit hook, so on
// PostgreSQL it joins the record's transaction.
func (h *Handler) addPayment(ctx context.Context, p *payment) error {
	if h.pg != nil {
		if err := h.pg.addPayment(ctx, p); err != nil {
			return err
		}
		// The reservation is in memory; the payment is in the database.
		h.ledger.unreserve(p.ID)
		return nil
	}
	h.ledger.add(p)
	return nil
}

func (h *Handler) findPayment(ctx context.Context, principal, id string) (*payment, bool, error) {
	if h.pg != nil {
		return h.pg.payment(ctx, principal, id)
	}
	p, ok := h.ledger.get(principal, id)
	return p, ok, nil
}

func (h *Handler) findPaymentByKey(ctx context.Context, principal, key string) (*payment, bool, error) {
	if h.pg != nil {
		return h.pg.paymentByKey(ctx, principal, key)
	}
	p, ok := h.ledger.byIdempotencyKey(principal, key)
	return p, ok, nil
}

func (h *Handler) paymentsOf(ctx context.Context, principal string) ([]*payment, error) {
	if h.pg != nil {
		return h.pg.payments(ctx, principal)
	}
	return h.ledger.list(principal), nil
}

// charge asks the fake provider to charge c, once per c.ID.
func (h *Handler) charge(ctx context.Context, c charge) (charge, error) {
	if h.pg != nil {
		return h.pg.charge(ctx, c)
	}
	return h.provider.Charge(c)
}

// lookupCharge asks the fake provider what it charged under id.
func (h *Handler) lookupCharge(ctx context.Context, id string) (charge, bool, error) {
	if h.pg != nil {
		return h.pg.lookupCharge(ctx, id)
	}
	c, ok := h.provider.Lookup(id)
	return c, ok, nil
}

// setOrderStatus reports false, changing nothing, when memory holds as
// many orders as Options.MaxOrders allows.
func (h *Handler) setOrderStatus(ctx context.Context, principal, id, status string) (bool, error) {
	if h.pg != nil {
		return true, h.pg.setOrderStatus(ctx, principal, id, status)
	}
	return h.orders.set(idempotency.ID{Principal: principal, Key: id}, status, h.cfg.maxOrders), nil
}

func (h *Handler) stats(ctx context.Context) (Stats, error) {
	if h.pg != nil {
		return h.pg.stats(ctx)
	}
	records, inProgress, _ := h.store.Count(ctx)
	return Stats{
		Payments:        h.ledger.count(),
		ProviderCharges: h.provider.count(),
		Executions:      int(h.executions.Load()),
		Records:         records,
		InProgress:      inProgress,
		Requests:        int(h.requests.Load()),
	}, nil
}
