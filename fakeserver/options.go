package fakeserver

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver/internal/fakestate"
	"github.com/idemkit/idem/idempotency"
)

// Options configures a fake server: every setting of [NewServer] and
// [NewHandler] is a field here, and there is no other
// way to configure one. A nil *Options, or a zero Options, consists
// entirely of default values.
type Options struct {
	// Retention is how long a record lives, from its created_at. Zero (or
	// negative) means 24h. It must be longer than Lease: NewHandler panics
	// otherwise.
	Retention time.Duration
	// Lease is how long a worker holds an IN_PROGRESS record before another
	// request may take it over. Zero (or negative) means 30s. It must be
	// longer than ProcessingDelay (a payment still running would be taken
	// over by its resend and run twice): the constructors panic otherwise.
	Lease time.Duration
	// ProcessingDelay is the time each payment takes. It is waited out with
	// Sleep. The wait ends early if the client goes away. Zero means none.
	ProcessingDelay time.Duration
	// Sleep waits out ProcessingDelay and the delay faults. It returns
	// ctx's error if ctx ends first. Nil means real time. It is apart
	// from Clock: a Manual's Sleep moves it at once. Tests of concurrent
	// requests need the work held in real time. A simulation passes its
	// virtual clock's wait.
	Sleep func(ctx context.Context, d time.Duration) error
	// NewID makes the stable id of each payment. It must never repeat.
	// The provider takes it as its idempotency key. Nil means ids that
	// sort by the Clock's time. A simulation draws them from its seed.
	NewID func() string
	// WrapRecords wraps the record store of the idempotency layer. The
	// layer then uses what it returns. The server's own reads (lookup,
	// stats, sweep) still go to the store it wraps. A simulation's wrapper
	// pauses between steps and fails on demand. Nil means no wrapper.
	WrapRecords func(idempotency.Store) idempotency.Store
	// RequireUUID accepts only UUIDs in their 36-character form as keys,
	// compared in any case (an upper-case key and its lower-cased retry
	// are one key); false accepts any key of 1-255 visible ASCII
	// characters, compared byte for byte.
	RequireUUID bool
	// Clock tells the time to retention, leases, created_at, payment ids
	// and Retry-After, so that tests drive them without sleeping: pass the
	// clock.Manual given to the client. Nil means the system clock, and on
	// PostgreSQL the database's clock for leases and retention. Servers that
	// share a database with a Clock must share the Clock too.
	Clock clock.Clock
	// SweepEvery is how often a [Server] deletes expired records in the
	// background (real time). Zero means never; [Handler.Sweep] and
	// POST /_fake/sweep still work, and a program that mounts a [Handler]
	// calls Sweep on its own ticker.
	SweepEvery time.Duration
	// Logger gets one line per request (method, path, key, status,
	// outcome), and the errors of the server's own state (a failed
	// database statement), which answers never show: a 500 says only that
	// the server failed. Nil means silent.
	Logger *slog.Logger
	// MaxRecords bounds the idempotency records held. When it is reached
	// and none has expired, POST /payments with a new key is answered 503,
	// type https://idem.dev/problems/storage-full, with Retry-After until the earliest record
	// expires; nothing is stored or charged. Keys already held still
	// replay. Zero (or negative) means no bound.
	MaxRecords int
	// MaxPayments bounds the payments held (they do not expire). When it is
	// reached, a new payment is answered 503, type storage-full,
	// before the provider is called; nothing is stored or charged, and the
	// key stays unused. POST /_fake/reset makes room. Zero (or negative)
	// means no bound.
	MaxPayments int
	// MaxOrders bounds the order statuses held (PUT /orders/{id}/status).
	// When it is reached, a status for a new order is answered 503, type
	// storage-full, and nothing changes; known orders can still be
	// updated. Zero (or negative) means no bound.
	MaxOrders int
	// Storage, if not nil, keeps the records, payments, the fake
	// provider's charges, order statuses and the counters instead of
	// memory. pgfake.New (package
	// github.com/idemkit/idem/fakeserver/pgfake) keeps them in PostgreSQL,
	// so that several fake server processes on one database act as one
	// server and report the same [Stats]. Faults stay per process, and
	// MaxRecords, MaxPayments and MaxOrders, which bound memory, do not
	// apply.
	Storage Storage
	// Endpoints are endpoints of the app's own API that the server serves
	// beside its payments, behind the same idempotency layer, faults,
	// counters and log: a POST /orders of the app's, say, faked with the
	// handler its server runs. See [Endpoint]. NewHandler panics on an
	// endpoint it cannot serve, naming it.
	Endpoints []Endpoint
}

// config is Options with the defaults filled in.
type config struct {
	retention, lease, delay, sweepEvery time.Duration
	uuid                                bool
	maxRecords, maxPayments, maxOrders  int
	clock                               clock.Clock // nil: the system clock
	now                                 func() time.Time
	logger                              *slog.Logger
	storage                             Storage
	endpoints                           []Endpoint
	sleep                               func(context.Context, time.Duration) error
	newID                               func() string
	wrapRecords                         func(idempotency.Store) idempotency.Store
}

func (o *Options) config() config {
	var c config
	if o != nil {
		c = config{retention: o.Retention, lease: o.Lease, delay: o.ProcessingDelay, sweepEvery: o.SweepEvery,
			clock: o.Clock, logger: o.Logger, maxRecords: max(o.MaxRecords, 0), maxPayments: max(o.MaxPayments, 0),
			maxOrders: max(o.MaxOrders, 0), storage: o.Storage, uuid: o.RequireUUID, endpoints: o.Endpoints,
			sleep: o.Sleep, newID: o.NewID, wrapRecords: o.WrapRecords}
	}
	if c.retention <= 0 {
		c.retention = 24 * time.Hour
	}
	if c.lease <= 0 {
		c.lease = 30 * time.Second
	}
	if c.delay < 0 {
		c.delay = 0
	}
	if c.delay > 0 && c.lease <= c.delay {
		panic(fmt.Sprintf("fakeserver: Lease (%v) must be longer than ProcessingDelay (%v): a payment still running would be taken over by its resend and run twice", c.lease, c.delay))
	}
	if c.sleep == nil {
		c.sleep = sleep
	}
	c.now = time.Now
	if c.clock != nil {
		c.now = c.clock.Now
	}
	return c
}

// Storage is a place other than memory where a server keeps its state:
// package github.com/idemkit/idem/fakeserver/pgfake's New returns one that
// keeps it in PostgreSQL. Its method is unexported: pgfake's is the one
// implementation, and the contract between the server and its state may
// change in any release.
type Storage interface {
	open(clk clock.Clock) fakestate.State
}

// storage is the Storage of a fakestate.Storage.
type storage struct{ st fakestate.Storage }

func (s storage) open(clk clock.Clock) fakestate.State { return s.st.Open(clk) }

func init() {
	// pgfake makes its Storage through this, so that the package's API
	// names no internal type.
	fakestate.Public = func(st fakestate.Storage) any { return storage{st} }
}
