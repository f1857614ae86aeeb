// Package fakestate is the seam between the fake server's handler and the
// place it keeps its state: records, payments, intents to charge, the fake
// provider's charges, order statuses and counters. The fake server keeps
// them in memory; package pgfake keeps them in PostgreSQL, so that several
// processes act as one server. The handler reaches its state only through
// [State].
package fakestate

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
)

// Storage makes a handler's State. A Storage may be given to several
// handlers; each opens its own State.
type Storage interface {
	// Open returns the state for a handler whose leases, retention and
	// created_at are told by clk (nil: the system's clock, or the
	// database's).
	Open(clk clock.Clock) State
}

// Public turns st into a fakeserver.Storage, the type of
// fakeserver.Options.Storage. Package fakeserver sets it as it
// initialises; package pgfake, which imports fakeserver, calls it. The
// result is any because this package cannot import fakeserver.
var Public func(st Storage) any

// State is where a handler keeps what it knows. Memory never fails; a
// database may, and the error says what was being done.
type State interface {
	// Records is the idempotency store.
	Records() idempotency.Store
	// Record returns the live idempotency record id at now, if any.
	Record(ctx context.Context, id idempotency.ID, now time.Time) (*idempotency.Record, bool, error)
	// Count adds one to the counter c. A lost count of requests is no
	// reason to refuse one: callers may ignore the error.
	Count(ctx context.Context, c Counter) error
	// Reserve holds room for payment id before the provider is asked to
	// charge it, and records the intent to charge: what the request asked,
	// under which record. It reports false if there is no room. A payment
	// already made or reserved under id has its room (a takeover reuses
	// its dead worker's id).
	Reserve(ctx context.Context, id string, in Intent, now time.Time) (bool, error)
	// Intent returns the intent to charge under payment id, if one is held.
	Intent(ctx context.Context, id string) (Intent, bool, error)
	// Declined frees the room held for payment id, which the provider
	// declined. The intent stays where another process may read it: the
	// latest under its key, not charged.
	Declined(id string)
	// AddPayment stores p; called from the request's commit hook, so that
	// in a database it joins the record's transaction.
	AddPayment(ctx context.Context, p *Payment) error
	// Payment returns the caller's payment id.
	Payment(ctx context.Context, principal, id string) (*Payment, bool, error)
	// Payments returns the caller's payments in the order they were made.
	Payments(ctx context.Context, principal string) ([]*Payment, error)
	// Charge asks the fake provider to charge c, once per c.ID: a repeated
	// id returns the first charge. It returns ErrDeclined, charging
	// nothing, for DeclinedCustomer.
	Charge(ctx context.Context, c Charge) (Charge, error)
	// LookupCharge asks the fake provider what it charged under id.
	LookupCharge(ctx context.Context, id string) (Charge, bool, error)
	// Recover returns the payment of the latest intent under the key id,
	// once no request can settle its record (it is done, expired or gone),
	// recording first what the provider charged for it under a worker that
	// died. It reports false when there is none.
	Recover(ctx context.Context, id idempotency.ID) (*Payment, bool, error)
	// SetOrderStatus sets the caller's order id to status. It reports
	// false, changing nothing, when there is no room for a new order.
	SetOrderStatus(ctx context.Context, principal, id, status string) (bool, error)
	// Stats returns the counters.
	Stats(ctx context.Context) (Stats, error)
	// Sweep deletes the records expired at now, recording first the
	// charges of the dead workers among them, and returns how many.
	Sweep(ctx context.Context, now time.Time) (int, error)
	// Reset forgets everything.
	Reset(ctx context.Context) error
}

// Counter names a counter of [Stats].
type Counter string

// The counters.
const (
	Requests   Counter = "requests"
	Executions Counter = "executions"
)

// Stats are the counters, as the fake server reports them.
type Stats struct {
	Payments        int `json:"payments"`
	ProviderCharges int `json:"provider_charges"`
	Executions      int `json:"executions"`
	Records         int `json:"records"`
	InProgress      int `json:"in_progress"`
	Requests        int `json:"requests"`
}

// Payment is a successful payment, as stored and as answered.
type Payment struct {
	ID          string    `json:"id"`
	Amount      int64     `json:"amount"`
	Currency    string    `json:"currency"`
	Customer    string    `json:"customer"`
	Description string    `json:"description"`
	Status      string    `json:"status"`
	CreatedAt   time.Time `json:"created_at"`

	Principal string `json:"-"` // the caller
	Key       string `json:"-"` // the Idempotency-Key it was made under; "" when bare
}

// Charge is one charge the fake provider made.
type Charge struct {
	ID        string // the server's stable id, the provider's idempotency key
	Amount    int64
	Currency  string
	Customer  string
	CreatedAt time.Time
	// Record and Description are what the request asked, under which
	// record. Memory keeps them for Handler.Charges; PostgreSQL does not.
	Record      idempotency.ID
	Description string
}

// Intent is a payment the provider may have charged and nobody has
// recorded yet: what the request asked, under which record.
type Intent struct {
	Record      idempotency.ID
	Description string
}

// Payment is the payment the intent became: the provider's charge ch of
// payment id.
func (in Intent) Payment(id string, ch Charge) *Payment {
	return &Payment{ID: id, Amount: ch.Amount, Currency: ch.Currency, Customer: ch.Customer, Description: in.Description,
		Status: "succeeded", CreatedAt: ch.CreatedAt, Principal: in.Record.Principal, Key: in.Record.Key}
}

// ErrDeclined is the provider's answer for [DeclinedCustomer].
var ErrDeclined = errors.New("fakeserver: card declined")

// DeclinedCustomer is the customer whose card the provider always declines.
const DeclinedCustomer = "cus_declined"
