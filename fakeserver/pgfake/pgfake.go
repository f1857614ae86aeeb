// Package pgfake keeps a fake server's state in PostgreSQL. So several
// fake server processes on one database act as one server. The database
// holds the idempotency records (a [pgstore.Store]) and the payments. It
// holds the intents to charge, the fake provider's charges, order statuses
// and the counters too. Give [New]'s Storage to the server in
// fakeserver.Options.Storage, after [Migrate] created the tables:
//
//	if err := pgfake.Migrate(ctx, pool); err != nil { ... }
//	srv := fakeserver.NewServer(&fakeserver.Options{Storage: pgfake.New(ctx, pool)})
//
// A payment commits in the transaction that marks its record COMPLETED.
// An intent to charge is a row written before the provider is called. So
// a process that dies after the provider charged leaves its charge to
// every other process. Tables name their caller by
// [idempotency.PrincipalDigest], as the records do. So no table holds a
// credential.
package pgfake

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/internal/fakestate"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/pgstore"
)

//go:embed schema.sql
var schemaSQL string

// schemaLock is the advisory lock that serialises Migrate across
// processes. It is "fake" in ASCII.
const schemaLock = 0x66616b65

// Migrate creates in pool's database what a fake server on PostgreSQL
// keeps. That includes the idempotency records, through [pgstore.Migrate].
// It is safe to call on every start, from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgstore.Migrate(ctx, pool); err != nil {
		return err
	}
	// READ COMMITTED whatever the database's default, as pgstore.Migrate.
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", schemaLock); err != nil {
			return fmt.Errorf("pgfake: migrate: take the schema lock: %w", err)
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("pgfake: migrate: create the tables: %w", err)
		}
		return nil
	})
}

// New returns the Storage for fakeserver.Options.Storage that keeps the
// state in pool's database. Call [Migrate] first. Leases and retention are
// judged on the database's clock. Tests may set the server's
// Options.Clock instead. Every server on the database must then share it.
//
// ctx bounds the database work of every request and sweep of the servers
// given the Storage. Once it is done, each statement is cancelled. A
// request that had not committed its payment then commits nothing. Its
// record stays, for a resend to take over. Cancel ctx when the drain time
// is over. Then a commit waiting on a lock neither keeps the program
// running nor lands after it stopped. Close the pool after that. It waits
// only for the cancelled statements.
func New(ctx context.Context, pool *pgxpool.Pool) fakeserver.Storage {
	return fakestate.Public(storage{life: ctx, pool: pool}).(fakeserver.Storage)
}

type storage struct {
	life context.Context
	pool *pgxpool.Pool
}

func (st storage) Open(clk clock.Clock) fakestate.State {
	s := &state{pool: st.pool, clock: clk, life: st.life}
	store := pgstore.New(st.pool, &pgstore.Options{Clock: clk})
	// The middleware saves a finished request's outcome even when its
	// client has gone. The end of life still ends that work.
	s.records, s.store = abortable{Store: store, life: st.life}, store
	return s
}

// state is the fake server's state in PostgreSQL. Every process on the
// database sees the same records, payments, charges and counters.
type state struct {
	pool    *pgxpool.Pool
	store   *pgstore.Store
	records idempotency.Store // store, bounded by life
	clock   clock.Clock       // nil: the database's clock judges expiry, as the store's
	life    context.Context
}

// bound returns ctx, cancelled also when life is done.
func bound(life, ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(life, cancel)
	return ctx, func() { stop(); cancel() }
}

func (s *state) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return bound(s.life, ctx)
}

// abortable is a Store whose every call ends when life is done.
type abortable struct {
	idempotency.Store
	life context.Context
}

func (a abortable) Insert(ctx context.Context, rec *idempotency.Record) (*idempotency.Record, bool, error) {
	ctx, cancel := bound(a.life, ctx)
	defer cancel()
	return a.Store.Insert(ctx, rec)
}

func (a abortable) TakeOver(ctx context.Context, id idempotency.ID, from, to string, now, until time.Time) (bool, error) {
	ctx, cancel := bound(a.life, ctx)
	defer cancel()
	return a.Store.TakeOver(ctx, id, from, to, now, until)
}

func (a abortable) Complete(ctx context.Context, id idempotency.ID, owner string, resp *idempotency.Response, commit func(context.Context) error) error {
	ctx, cancel := bound(a.life, ctx)
	defer cancel()
	return a.Store.Complete(ctx, id, owner, resp, commit)
}

func (a abortable) Release(ctx context.Context, id idempotency.ID, owner string) error {
	ctx, cancel := bound(a.life, ctx)
	defer cancel()
	return a.Store.Release(ctx, id, owner)
}

func (a abortable) Sweep(ctx context.Context, now time.Time) (int, error) {
	ctx, cancel := bound(a.life, ctx)
	defer cancel()
	return a.Store.Sweep(ctx, now)
}

func (s *state) Records() idempotency.Store { return s.records }

// now is the time to judge expiry by in a statement, as
// coalesce($n::timestamptz, clock_timestamp()). It is nil for the
// database's clock.
func (s *state) now() *time.Time {
	if s.clock == nil {
		return nil
	}
	t := s.clock.Now()
	return &t
}

const paymentColumns = `id, principal, idem_key, amount, currency, customer, description, status, created_at`

func scanPayment(row pgx.Row) (*fakestate.Payment, error) {
	var p fakestate.Payment
	err := row.Scan(&p.ID, &p.Principal, &p.Key, &p.Amount, &p.Currency, &p.Customer, &p.Description, &p.Status, &p.CreatedAt)
	if err != nil {
		return nil, err
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return &p, nil
}

// addPayment stores p. Inside [pgstore.Store.Complete] it writes through
// Complete's transaction. So the payment commits with the record or not
// at all.
func (s *state) addPayment(ctx context.Context, p *fakestate.Payment) error {
	return s.insertPayment(ctx, p, idempotency.PrincipalDigest(p.Principal))
}

// insertPayment stores p under the caller's digest.
func (s *state) insertPayment(ctx context.Context, p *fakestate.Payment, digest string) error {
	const q = `INSERT INTO fake_payments (` + paymentColumns + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (id) DO NOTHING`
	args := []any{p.ID, digest, p.Key, p.Amount, p.Currency, p.Customer, p.Description, p.Status, p.CreatedAt}
	var err error
	if tx, ok := pgstore.Tx(ctx); ok {
		_, err = tx.Exec(ctx, q, args...)
	} else {
		_, err = s.pool.Exec(ctx, q, args...)
	}
	if err != nil {
		return fmt.Errorf("pgfake: store payment %s: %w", p.ID, err)
	}
	return nil
}

func (s *state) payment(ctx context.Context, principal, id string) (*fakestate.Payment, bool, error) {
	return s.onePayment(ctx, "read payment "+id,
		`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND id = $2`, idempotency.PrincipalDigest(principal), id)
}

// paymentOf is payment with the caller's digest.
func (s *state) paymentOf(ctx context.Context, digest, id string) (*fakestate.Payment, bool, error) {
	return s.onePayment(ctx, "read payment "+id,
		`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND id = $2`, digest, id)
}

// paymentByKey returns the latest payment made under key.
func (s *state) paymentByKey(ctx context.Context, principal, key string) (*fakestate.Payment, bool, error) {
	return s.onePayment(ctx, "read the payment under a key",
		`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND idem_key = $2 AND idem_key <> ''
		ORDER BY seq DESC LIMIT 1`, idempotency.PrincipalDigest(principal), key)
}

// addIntent records what the request asked and under which key. It runs
// before the provider is asked to charge payment id. A takeover reuses its
// dead worker's id, and finds the row there already.
func (s *state) addIntent(ctx context.Context, id string, r fakestate.Intent, now time.Time) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO fake_intents (id, principal, idem_key, description, created_at)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`, id, idempotency.PrincipalDigest(r.Record.Principal), r.Record.Key, r.Description, now)
	if err != nil {
		return fmt.Errorf("pgfake: record the intent to charge %s: %w", id, err)
	}
	return nil
}

// intent returns the intent to charge payment id. Its rec.Principal is the
// caller's digest, which is all the table keeps.
func (s *state) intent(ctx context.Context, id string) (fakestate.Intent, bool, error) {
	var r fakestate.Intent
	err := s.pool.QueryRow(ctx, `SELECT principal, idem_key, description FROM fake_intents WHERE id = $1`, id).
		Scan(&r.Record.Principal, &r.Record.Key, &r.Description)
	if errors.Is(err, pgx.ErrNoRows) {
		return fakestate.Intent{}, false, nil
	}
	if err != nil {
		return fakestate.Intent{}, false, fmt.Errorf("pgfake: read the intent to charge %s: %w", id, err)
	}
	return r, true, nil
}

// recoverLatest returns the payment of the latest intent under the key id.
// It does so once no record of the key is live. That is the payment if it
// was recorded. Or it is the charge the provider made under a dead worker,
// recorded now. The key's expired record, until swept, is its latest
// intent. Its stable id is the provider's key, with or without an intent
// row. Without a record, the latest intent row stands. Without either,
// the latest payment under the key stands. Older builds wrote no intent
// rows.
func (s *state) recoverLatest(ctx context.Context, id idempotency.ID) (*fakestate.Payment, bool, error) {
	var (
		pid string
		r   = fakestate.Intent{Record: id}
	)
	digest := idempotency.PrincipalDigest(id.Principal)
	err := s.pool.QueryRow(ctx, `SELECT r.stable_id, coalesce(i.description, '') FROM idempotency_records r
		LEFT JOIN fake_intents i ON i.id = r.stable_id WHERE r.caller = $1 AND r.key = $2`, digest, id.Key).
		Scan(&pid, &r.Description)
	if err == nil {
		return s.settle(ctx, pid, r, digest)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("pgfake: read the expired record of a key: %w", err)
	}
	err = s.pool.QueryRow(ctx, `SELECT id, description FROM fake_intents WHERE principal = $1 AND idem_key = $2
		ORDER BY seq DESC LIMIT 1`, digest, id.Key).Scan(&pid, &r.Description)
	if errors.Is(err, pgx.ErrNoRows) {
		return s.paymentByKey(ctx, id.Principal, id.Key)
	}
	if err != nil {
		return nil, false, fmt.Errorf("pgfake: read the latest intent under a key: %w", err)
	}
	return s.settle(ctx, pid, r, digest)
}

// settle returns the payment of intent r under payment id. It records the
// payment first if the provider charged it and no worker recorded it.
// digest is the caller's.
func (s *state) settle(ctx context.Context, id string, r fakestate.Intent, digest string) (*fakestate.Payment, bool, error) {
	if p, ok, err := s.paymentOf(ctx, digest, id); err != nil || ok {
		return p, ok, err
	}
	ch, charged, err := s.lookupCharge(ctx, id)
	if err != nil || !charged {
		return nil, false, err
	}
	if err := s.insertPayment(ctx, r.Payment(id, ch), digest); err != nil {
		return nil, false, err
	}
	return s.paymentOf(ctx, digest, id)
}

// recoverExpired records the charges of dead workers as payments. It
// looks at IN_PROGRESS records expired on the store's clock, with
// retention and lease both ended. It runs before the sweep deletes them. A
// record's stable id is the provider's key, with or without an intent
// row. Without an intent row, the payment's description is unknown.
func (s *state) recoverExpired(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT r.stable_id, r.caller, r.key, coalesce(i.description, '')
		FROM idempotency_records r LEFT JOIN fake_intents i ON i.id = r.stable_id
		WHERE r.status = 'IN_PROGRESS' AND r.expires_at <= coalesce($1::timestamptz, clock_timestamp())
		AND coalesce(r.locked_until <= coalesce($1::timestamptz, clock_timestamp()), true)
		AND NOT EXISTS (SELECT 1 FROM fake_payments p WHERE p.id = r.stable_id)`, s.now())
	if err != nil {
		return fmt.Errorf("pgfake: read the expired unsettled records: %w", err)
	}
	type pending struct {
		id string
		r  fakestate.Intent
	}
	var todo []pending
	for rows.Next() {
		var p pending
		if err := rows.Scan(&p.id, &p.r.Record.Principal, &p.r.Record.Key, &p.r.Description); err != nil {
			rows.Close()
			return fmt.Errorf("pgfake: read the expired unsettled records: %w", err)
		}
		todo = append(todo, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgfake: read the expired unsettled records: %w", err)
	}
	for _, p := range todo {
		// The table holds the caller's digest, in p.r.Record.Principal.
		if _, _, err := s.settle(ctx, p.id, p.r, p.r.Record.Principal); err != nil {
			return err
		}
	}
	return nil
}

func (s *state) onePayment(ctx context.Context, what, q string, args ...any) (*fakestate.Payment, bool, error) {
	p, err := scanPayment(s.pool.QueryRow(ctx, q, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("pgfake: %s: %w", what, err)
	}
	return p, true, nil
}

func (s *state) payments(ctx context.Context, principal string) ([]*fakestate.Payment, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 ORDER BY seq`, idempotency.PrincipalDigest(principal))
	if err != nil {
		return nil, fmt.Errorf("pgfake: list payments: %w", err)
	}
	out := []*fakestate.Payment{}
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgfake: list payments: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgfake: list payments: %w", err)
	}
	return out, nil
}

// charge is the provider's Charge: one charge per id, in one statement. A
// repeated id returns the first charge.
func (s *state) charge(ctx context.Context, c fakestate.Charge) (fakestate.Charge, error) {
	if c.Customer == fakestate.DeclinedCustomer {
		return fakestate.Charge{}, fakestate.ErrDeclined
	}
	out := fakestate.Charge{ID: c.ID}
	err := s.pool.QueryRow(ctx, `INSERT INTO fake_charges (id, amount, currency, customer, created_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET id = fake_charges.id
		RETURNING amount, currency, customer, created_at`, c.ID, c.Amount, c.Currency, c.Customer, c.CreatedAt,
	).Scan(&out.Amount, &out.Currency, &out.Customer, &out.CreatedAt)
	if err != nil {
		return fakestate.Charge{}, fmt.Errorf("pgfake: provider: charge %s: %w", c.ID, err)
	}
	out.CreatedAt = out.CreatedAt.UTC()
	return out, nil
}

func (s *state) lookupCharge(ctx context.Context, id string) (fakestate.Charge, bool, error) {
	out := fakestate.Charge{ID: id}
	err := s.pool.QueryRow(ctx, `SELECT amount, currency, customer, created_at FROM fake_charges WHERE id = $1`, id).
		Scan(&out.Amount, &out.Currency, &out.Customer, &out.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return fakestate.Charge{}, false, nil
	}
	if err != nil {
		return fakestate.Charge{}, false, fmt.Errorf("pgfake: provider: look up charge %s: %w", id, err)
	}
	out.CreatedAt = out.CreatedAt.UTC()
	return out, true, nil
}

// count adds one to the shared counter name.
func (s *state) count(ctx context.Context, name string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO fake_counters (name, n) VALUES ($1, 1)
		ON CONFLICT (name) DO UPDATE SET n = fake_counters.n + 1`, name)
	if err != nil {
		return fmt.Errorf("pgfake: count %s: %w", name, err)
	}
	return nil
}

func (s *state) setOrderStatus(ctx context.Context, principal, id, status string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO fake_orders (principal, id, status) VALUES ($1, $2, $3)
		ON CONFLICT (principal, id) DO UPDATE SET status = EXCLUDED.status`, idempotency.PrincipalDigest(principal), id, status)
	if err != nil {
		return fmt.Errorf("pgfake: set the status of order %s: %w", id, err)
	}
	return nil
}

// stats reads every counter in one statement. So the totals are of one
// moment.
func (s *state) stats(ctx context.Context) (fakestate.Stats, error) {
	var st fakestate.Stats
	err := s.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM fake_payments),
		(SELECT count(*) FROM fake_charges),
		coalesce((SELECT n FROM fake_counters WHERE name = 'executions'), 0),
		(SELECT count(*) FROM idempotency_records),
		(SELECT count(*) FROM idempotency_records WHERE status = 'IN_PROGRESS'),
		coalesce((SELECT n FROM fake_counters WHERE name = 'requests'), 0)`).
		Scan(&st.Payments, &st.ProviderCharges, &st.Executions, &st.Records, &st.InProgress, &st.Requests)
	if err != nil {
		return fakestate.Stats{}, fmt.Errorf("pgfake: read the statistics: %w", err)
	}
	return st, nil
}

func (s *state) reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE idempotency_records, fake_payments, fake_intents, fake_charges, fake_orders, fake_counters`)
	if err != nil {
		return fmt.Errorf("pgfake: reset: %w", err)
	}
	return nil
}

// The methods of fakestate.State. Each statement ends when life is done.

func (s *state) Record(ctx context.Context, id idempotency.ID, now time.Time) (*idempotency.Record, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.store.Get(ctx, id, now)
}

func (s *state) Count(ctx context.Context, c fakestate.Counter) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.count(ctx, string(c))
}

// Reserve records the intent to charge, in a row every process on the
// database finds. So a charge whose process died is never lost. The
// database bounds nothing, so there is always room.
func (s *state) Reserve(ctx context.Context, id string, in fakestate.Intent, now time.Time) (bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return true, s.addIntent(ctx, id, in, now)
}

func (s *state) Intent(ctx context.Context, id string) (fakestate.Intent, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.intent(ctx, id)
}

// Declined keeps the intent as the latest under its key, not charged.
func (s *state) Declined(string) {}

// AddPayment stores p. Inside [pgstore.Store.Complete] it writes through
// Complete's transaction. So the payment commits with the record or not at
// all.
//
// Complete runs it without the request's cancellation, since a payment is
// recorded even if its client went away. Only the store's CommitTimeout
// bounds it. The end of life must end it too, at once. Then a program
// that stops does not wait on a lock for that long, and nothing of it
// commits.
func (s *state) AddPayment(ctx context.Context, p *fakestate.Payment) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.addPayment(ctx, p)
}

func (s *state) Payment(ctx context.Context, principal, id string) (*fakestate.Payment, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.payment(ctx, principal, id)
}

func (s *state) Payments(ctx context.Context, principal string) ([]*fakestate.Payment, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.payments(ctx, principal)
}

func (s *state) Charge(ctx context.Context, c fakestate.Charge) (fakestate.Charge, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.charge(ctx, c)
}

func (s *state) LookupCharge(ctx context.Context, id string) (fakestate.Charge, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.lookupCharge(ctx, id)
}

// Recover reads the key's latest intent from the database, whichever
// process wrote it.
func (s *state) Recover(ctx context.Context, id idempotency.ID) (*fakestate.Payment, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.recoverLatest(ctx, id)
}

// SetOrderStatus always has room: the database bounds nothing.
func (s *state) SetOrderStatus(ctx context.Context, principal, id, status string) (bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return true, s.setOrderStatus(ctx, principal, id, status)
}

func (s *state) Stats(ctx context.Context) (fakestate.Stats, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.stats(ctx)
}

// Sweep deletes the expired records. It first makes the charges of their
// dead workers payments.
func (s *state) Sweep(ctx context.Context, now time.Time) (int, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.recoverExpired(ctx); err != nil {
		return 0, err
	}
	return s.store.Sweep(ctx, now)
}

// Reset empties the shared tables, for every process on the database.
func (s *state) Reset(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.reset(ctx)
}
