package fakeserver

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/pgstore"
)

//go:embed postgres.sql
var schemaSQL string

// schemaLock is the advisory lock that serialises Migrate across processes
// ("fake" in ASCII).
const schemaLock = 0x66616b65

// Migrate creates in pool's database what a fake server on PostgreSQL
// (see [Options.Postgres]) keeps: the idempotency records (with
// [pgstore.Migrate]), payments, the fake provider's charges, order
// statuses and the counters. It is safe to call on every start, from
// several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgstore.Migrate(ctx, pool); err != nil {
		return err
	}
	// READ COMMITTED whatever the database's default, as pgstore.Migrate.
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", schemaLock); err != nil {
			return fmt.Errorf("fakeserver: migrate: take the schema lock: %w", err)
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("fakeserver: migrate: create the tables: %w", err)
		}
		return nil
	})
}

// pgState is the fake server's state in PostgreSQL: every process on the
// database sees the same records, payments, charges and counters. Payments,
// intents and orders name their caller by [idempotency.PrincipalDigest], as
// the records do.
type pgState struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	clock clock.Clock // nil: the database's clock judges expiry, as the store's
}

// newPGState keeps the state in pool's database. Leases and retention are
// judged on clk if it is not nil (tests), else on the database's clock.
func newPGState(pool *pgxpool.Pool, clk clock.Clock) *pgState {
	return &pgState{pool: pool, store: pgstore.New(pool, &pgstore.Options{Clock: clk}), clock: clk}
}

// now is the time to judge expiry by in a statement, as
// coalesce($n::timestamptz, clock_timestamp()): nil for the database's.
func (s *pgState) now() *time.Time {
	if s.clock == nil {
		return nil
	}
	t := s.clock.Now()
	return &t
}

const paymentColumns = `id, principal, idem_key, amount, currency, customer, description, status, created_at`

func scanPayment(row pgx.Row) (*payment, error) {
	var p payment
	err := row.Scan(&p.ID, &p.principal, &p.key, &p.Amount, &p.Currency, &p.Customer, &p.Description, &p.Status, &p.CreatedAt)
	if err != nil {
		return nil, err
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return &p, nil
}

// addPayment stores p. Inside [pgstore.Store.Complete] (the effect of a
// request behind the middleware) it writes through Complete's transaction,
// so the payment commits with the record or not at all.
func (s *pgState) addPayment(ctx context.Context, p *payment) error {
	return s.insertPayment(ctx, p, idempotency.PrincipalDigest(p.principal))
}

// insertPayment stores p under the caller's digest.
func (s *pgState) insertPayment(ctx context.Context, p *payment, digest string) error {
	const q = `INSERT INTO fake_payments (` + paymentColumns + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (id) DO NOTHING`
	args := []any{p.ID, digest, p.key, p.Amount, p.Currency, p.Customer, p.Description, p.Status, p.CreatedAt}
	var err error
	if tx, ok := pgstore.Tx(ctx); ok {
		_, err = tx.Exec(ctx, q, args...)
	} else {
		_, err = s.pool.Exec(ctx, q, args...)
	}
	if err != nil {
		return fmt.Errorf("fakeserver: store payment %s: %w", p.ID, err)
	}
	return nil
}

func (s *pgState) payment(ctx context.Context, principal, id string) (*payment, bool, error) {
	return s.onePayment(ctx, "read payment "+id,
		`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND id = $2`, idempotency.PrincipalDigest(principal), id)
}

// paymentOf is payment with the caller's digest.
func (s *pgState) paymentOf(ctx context.Context, digest, id string) (*payment, bool, error) {
	return s.onePayment(ctx, "read payment "+id,
		`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND id = $2`, digest, id)
}

// paymentByKey returns the latest payment made under key.
func (s *pgState) paymentByKey(ctx context.Context, principal, key string) (*payment, bool, error) {
	return s.onePayment(ctx, "read the payment under a key",
		`SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 AND idem_key = $2 AND idem_key <> ''
		ORDER BY seq DESC LIMIT 1`, idempotency.PrincipalDigest(principal), key)
}

// addIntent records, before the provider is asked to charge payment id,
// what the request asked and under which key. A takeover, which reuses its
// dead worker's id, finds the row there already.
func (s *pgState) addIntent(ctx context.Context, id string, r reservation, now time.Time) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO fake_intents (id, principal, idem_key, description, created_at)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`, id, idempotency.PrincipalDigest(r.rec.Principal), r.rec.Key, r.description, now)
	if err != nil {
		return fmt.Errorf("fakeserver: record the intent to charge %s: %w", id, err)
	}
	return nil
}

// intent returns the intent to charge payment id; its rec.Principal is the
// caller's digest, which is all the table keeps.
func (s *pgState) intent(ctx context.Context, id string) (reservation, bool, error) {
	var r reservation
	err := s.pool.QueryRow(ctx, `SELECT principal, idem_key, description FROM fake_intents WHERE id = $1`, id).
		Scan(&r.rec.Principal, &r.rec.Key, &r.description)
	if errors.Is(err, pgx.ErrNoRows) {
		return reservation{}, false, nil
	}
	if err != nil {
		return reservation{}, false, fmt.Errorf("fakeserver: read the intent to charge %s: %w", id, err)
	}
	return r, true, nil
}

// recoverLatest returns the payment of the latest intent under the key id,
// once no record of it is live: the payment if it was recorded, or, if the
// provider charged it under a worker that died, that charge, recorded now.
// The key's expired record, until it is swept, is its latest intent: its
// stable id is the provider's key whether or not an intent row was written
// for it (a record from before intents were recorded has none). Without
// a record, it is the key's latest row of fake_intents, and without an
// intent either (payments made before intents were recorded), the latest
// payment under the key.
func (s *pgState) recoverLatest(ctx context.Context, id idempotency.ID) (*payment, bool, error) {
	var (
		pid string
		r   = reservation{rec: id}
	)
	digest := idempotency.PrincipalDigest(id.Principal)
	err := s.pool.QueryRow(ctx, `SELECT r.stable_id, coalesce(i.description, '') FROM idempotency_records r
		LEFT JOIN fake_intents i ON i.id = r.stable_id WHERE r.caller = $1 AND r.key = $2`, digest, id.Key).
		Scan(&pid, &r.description)
	if err == nil {
		return s.settle(ctx, pid, r, digest)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("fakeserver: read the expired record of a key: %w", err)
	}
	err = s.pool.QueryRow(ctx, `SELECT id, description FROM fake_intents WHERE principal = $1 AND idem_key = $2
		ORDER BY seq DESC LIMIT 1`, digest, id.Key).Scan(&pid, &r.description)
	if errors.Is(err, pgx.ErrNoRows) {
		return s.paymentByKey(ctx, id.Principal, id.Key)
	}
	if err != nil {
		return nil, false, fmt.Errorf("fakeserver: read the latest intent under a key: %w", err)
	}
	return s.settle(ctx, pid, r, digest)
}

// settle returns the payment of intent r under payment id, recording it
// first if the provider charged it and no worker recorded it; digest is the
// caller's.
func (s *pgState) settle(ctx context.Context, id string, r reservation, digest string) (*payment, bool, error) {
	if p, ok, err := s.paymentOf(ctx, digest, id); err != nil || ok {
		return p, ok, err
	}
	ch, charged, err := s.lookupCharge(ctx, id)
	if err != nil || !charged {
		return nil, false, err
	}
	if err := s.insertPayment(ctx, r.payment(id, ch), digest); err != nil {
		return nil, false, err
	}
	return s.paymentOf(ctx, digest, id)
}

// recoverExpired records as payments the charges of the IN_PROGRESS
// records expired on the store's clock (retention and lease both ended),
// whose workers died, before the sweep deletes the records. A record's stable id is the provider's key
// whether or not an intent row was written for it (a record from before
// intents were recorded has none; its payment's description is then
// unknown).
func (s *pgState) recoverExpired(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT r.stable_id, r.caller, r.key, coalesce(i.description, '')
		FROM idempotency_records r LEFT JOIN fake_intents i ON i.id = r.stable_id
		WHERE r.status = 'IN_PROGRESS' AND r.expires_at <= coalesce($1::timestamptz, clock_timestamp())
		AND coalesce(r.locked_until <= coalesce($1::timestamptz, clock_timestamp()), true)
		AND NOT EXISTS (SELECT 1 FROM fake_payments p WHERE p.id = r.stable_id)`, s.now())
	if err != nil {
		return fmt.Errorf("fakeserver: read the expired unsettled records: %w", err)
	}
	type pending struct {
		id string
		r  reservation
	}
	var todo []pending
	for rows.Next() {
		var p pending
		if err := rows.Scan(&p.id, &p.r.rec.Principal, &p.r.rec.Key, &p.r.description); err != nil {
			rows.Close()
			return fmt.Errorf("fakeserver: read the expired unsettled records: %w", err)
		}
		todo = append(todo, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("fakeserver: read the expired unsettled records: %w", err)
	}
	for _, p := range todo {
		// The table holds the caller's digest, in p.r.rec.Principal.
		if _, _, err := s.settle(ctx, p.id, p.r, p.r.rec.Principal); err != nil {
			return err
		}
	}
	return nil
}

func (s *pgState) onePayment(ctx context.Context, what, q string, args ...any) (*payment, bool, error) {
	p, err := scanPayment(s.pool.QueryRow(ctx, q, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("fakeserver: %s: %w", what, err)
	}
	return p, true, nil
}

func (s *pgState) payments(ctx context.Context, principal string) ([]*payment, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+paymentColumns+` FROM fake_payments WHERE principal = $1 ORDER BY seq`, idempotency.PrincipalDigest(principal))
	if err != nil {
		return nil, fmt.Errorf("fakeserver: list payments: %w", err)
	}
	out := []*payment{}
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("fakeserver: list payments: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("fakeserver: list payments: %w", err)
	}
	return out, nil
}

// charge is the provider's Charge: one charge per id, in one statement; a
// repeated id returns the first charge.
func (s *pgState) charge(ctx context.Context, c charge) (charge, error) {
	if c.Customer == declinedCustomer {
		return charge{}, errDeclined
	}
	out := charge{ID: c.ID}
	err := s.pool.QueryRow(ctx, `INSERT INTO fake_charges (id, amount, currency, customer, created_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET id = fake_charges.id
		RETURNING amount, currency, customer, created_at`, c.ID, c.Amount, c.Currency, c.Customer, c.CreatedAt,
	).Scan(&out.Amount, &out.Currency, &out.Customer, &out.CreatedAt)
	if err != nil {
		return charge{}, fmt.Errorf("fakeserver: provider: charge %s: %w", c.ID, err)
	}
	out.CreatedAt = out.CreatedAt.UTC()
	return out, nil
}

func (s *pgState) lookupCharge(ctx context.Context, id string) (charge, bool, error) {
	out := charge{ID: id}
	err := s.pool.QueryRow(ctx, `SELECT amount, currency, customer, created_at FROM fake_charges WHERE id = $1`, id).
		Scan(&out.Amount, &out.Currency, &out.Customer, &out.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return charge{}, false, nil
	}
	if err != nil {
		return charge{}, false, fmt.Errorf("fakeserver: provider: look up charge %s: %w", id, err)
	}
	out.CreatedAt = out.CreatedAt.UTC()
	return out, true, nil
}

// count adds one to the shared counter name.
func (s *pgState) count(ctx context.Context, name string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO fake_counters (name, n) VALUES ($1, 1)
		ON CONFLICT (name) DO UPDATE SET n = fake_counters.n + 1`, name)
	if err != nil {
		return fmt.Errorf("fakeserver: count %s: %w", name, err)
	}
	return nil
}

func (s *pgState) setOrderStatus(ctx context.Context, principal, id, status string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO fake_orders (principal, id, status) VALUES ($1, $2, $3)
		ON CONFLICT (principal, id) DO UPDATE SET status = EXCLUDED.status`, idempotency.PrincipalDigest(principal), id, status)
	if err != nil {
		return fmt.Errorf("fakeserver: set the status of order %s: %w", id, err)
	}
	return nil
}

// stats reads every counter in one statement, so the totals are of one
// moment.
func (s *pgState) stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := s.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM fake_payments),
		(SELECT count(*) FROM fake_charges),
		coalesce((SELECT n FROM fake_counters WHERE name = 'executions'), 0),
		(SELECT count(*) FROM idempotency_records),
		(SELECT count(*) FROM idempotency_records WHERE status = 'IN_PROGRESS'),
		coalesce((SELECT n FROM fake_counters WHERE name = 'requests'), 0)`).
		Scan(&st.Payments, &st.ProviderCharges, &st.Executions, &st.Records, &st.InProgress, &st.Requests)
	if err != nil {
		return Stats{}, fmt.Errorf("fakeserver: read the statistics: %w", err)
	}
	return st, nil
}

func (s *pgState) reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE idempotency_records, fake_payments, fake_intents, fake_charges, fake_orders, fake_counters`)
	if err != nil {
		return fmt.Errorf("fakeserver: reset: %w", err)
	}
	return nil
}
