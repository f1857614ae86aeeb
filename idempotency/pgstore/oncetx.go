package pgstore

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// errEndsWithRecord is what Commit and Rollback of the request's
// transaction return. The transaction ends with the record, and only the
// store ends it. A handler or effect that tries anyway fails its request
// (see [Store.RunOnce] and [Store.Complete]).
var errEndsWithRecord = errors.New("pgstore: the request's transaction commits with its record; only the store commits or rolls it back")

// errHandlerEnded is the error of RunOnce and Complete when the handler
// or the effect ended, or tried to end, its transaction. Nothing is
// stored.
var errHandlerEnded = errors.New("the handler ended the request's transaction (Commit, Rollback, or COMMIT or ROLLBACK as SQL), which only the store may end; nothing was stored")

// markSetting is the setting that holds the transaction's mark. It is
// local to the request's transaction. The mark is a random text set when
// the store begins the transaction ([lockAndMarkSQL], and holdSQL in
// Complete). It is checked when the record is written ([onceKeySQL],
// completeSQL and [markedSQL]). A handler that ends the transaction with
// SQL ends the mark with it. So a transaction it begins next has no mark.
const markSetting = "pgstore.request_tx"

// markedSQL says whether the statement runs in the transaction marked $1.
const markedSQL = `SELECT coalesce(current_setting('` + markSetting + `', true) = $1, false)`

// endGuard is the Commit and Rollback of a transaction that only the store
// ends. Both fail and remember that the handler meant to end it. So its
// answer cannot be stored as committed with it.
type endGuard struct {
	endTried bool
}

func (g *endGuard) Commit(context.Context) error   { g.endTried = true; return errEndsWithRecord }
func (g *endGuard) Rollback(context.Context) error { g.endTried = true; return errEndsWithRecord }

// onceTx is the transaction of [Store.RunOnce] and [Store.Complete] as the
// handler or effect sees it ([Tx]). The store begins it in the round trip
// of the key's lock. It ends it in the round trip of the record's write.
// pgx's own Begin cannot do that. So this is the connection inside a
// transaction block. Its nested transactions are savepoints, as pgx's are.
//
// Once the store has ended the transaction, every method but Conn fails
// with pgx.ErrTxClosed. pgx's own transactions do the same after their
// end. The connection is then back in the pool. A handler that kept the
// transaction must not write into the connection's next user's work.
type onceTx struct {
	conn       *pgx.Conn
	savepoints int64
	ended      atomic.Bool
	endGuard
}

// end makes t refuse every further use. The store calls it before the
// connection goes back to the pool.
func (t *onceTx) end() { t.ended.Store(true) }

var (
	_ pgx.Tx = (*onceTx)(nil)
	_ pgx.Tx = (*onceSavepoint)(nil)
)

func (t *onceTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.ended.Load() {
		return nil, pgx.ErrTxClosed
	}
	t.savepoints++
	sp := &onceSavepoint{onceTx: t, tx: t, name: "pgstore_sp_" + strconv.FormatInt(t.savepoints, 10)}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

func (t *onceTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.ended.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *onceTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.ended.Load() {
		return endedBatch{}
	}
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not available inside RunOnce or Complete. pgx builds it
// only on a transaction of its own. Its methods panic on a nil
// transaction, which rolls the request back.
func (t *onceTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *onceTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.ended.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Prepare(ctx, name, sql)
}

func (t *onceTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *onceTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.ended.Load() {
		return endedRows{}, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *onceTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.ended.Load() {
		return endedRows{}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *onceTx) Conn() *pgx.Conn { return t.conn }

// onceSavepoint is a nested transaction of onceTx.
type onceSavepoint struct {
	*onceTx
	tx     *onceTx
	name   string
	closed bool
}

func (sp *onceSavepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.tx.Begin(ctx)
}

func (sp *onceSavepoint) Commit(ctx context.Context) error {
	if sp.closed || sp.tx.ended.Load() {
		return pgx.ErrTxClosed
	}
	sp.closed = true
	_, err := sp.tx.conn.Exec(ctx, "RELEASE SAVEPOINT "+sp.name)
	return err
}

func (sp *onceSavepoint) Rollback(ctx context.Context) error {
	if sp.closed || sp.tx.ended.Load() {
		return pgx.ErrTxClosed
	}
	sp.closed = true
	_, err := sp.tx.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp.name)
	return err
}

// endedRows and endedBatch are what an ended onceTx's Query, QueryRow and
// SendBatch return. Their results hold pgx.ErrTxClosed.
type endedRows struct{}

func (endedRows) Close()                                       {}
func (endedRows) Err() error                                   { return pgx.ErrTxClosed }
func (endedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (endedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (endedRows) Next() bool                                   { return false }
func (endedRows) Scan(...any) error                            { return pgx.ErrTxClosed }
func (endedRows) Values() ([]any, error)                       { return nil, pgx.ErrTxClosed }
func (endedRows) RawValues() [][]byte                          { return nil }
func (endedRows) Conn() *pgx.Conn                              { return nil }
func (endedRows) TypeMap() *pgtype.Map                         { return pgtype.NewMap() }

type endedBatch struct{}

func (endedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (endedBatch) Query() (pgx.Rows, error)         { return endedRows{}, pgx.ErrTxClosed }
func (endedBatch) QueryRow() pgx.Row                { return endedRows{} }
func (endedBatch) Close() error                     { return pgx.ErrTxClosed }
func (endedBatch) Tx() pgx.Tx                       { return nil }
