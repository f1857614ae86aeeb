package pgstore

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errEndsWithRecord is what Commit and Rollback of the request's
// transaction return (RunOnce's, or the one Complete gives the effect): it
// ends with the record, and only the store ends it. A handler or effect
// that tries anyway fails its request (see [Store.RunOnce] and
// [Store.Complete]).
var errEndsWithRecord = errors.New("pgstore: the request's transaction commits with its record; only the store commits or rolls it back")

// errHandlerEnded is the error of RunOnce and Complete when the handler
// (or the effect) ended, or tried to end, the transaction it was given:
// nothing is stored.
var errHandlerEnded = errors.New("the handler ended the request's transaction (Commit, Rollback, or COMMIT or ROLLBACK as SQL), which only the store may end; nothing was stored")

// markSetting is the setting, local to the request's transaction (RunOnce's
// or Complete's), that holds the transaction's mark: a random text set when
// the store begins the transaction ([setMarkSQL]), and checked when the
// record is written ([markedSQL]). A handler that ends the transaction,
// with COMMIT or ROLLBACK as SQL, ends the mark with it; one that then
// begins another (ROLLBACK; BEGIN) has a transaction without the mark.
const markSetting = "pgstore.request_tx"

// setMarkSQL marks the transaction with $1; markedSQL says whether the
// statement runs in the transaction marked $1.
const (
	setMarkSQL = `SELECT set_config('` + markSetting + `', $1, true)`
	markedSQL  = `SELECT coalesce(current_setting('` + markSetting + `', true) = $1, false)`
)

// endGuard is the Commit and Rollback of a transaction that only the store
// ends: both fail and remember that the handler meant to end it, so that
// its answer cannot be stored as committed with it.
type endGuard struct {
	endTried bool
}

func (g *endGuard) Commit(context.Context) error   { g.endTried = true; return errEndsWithRecord }
func (g *endGuard) Rollback(context.Context) error { g.endTried = true; return errEndsWithRecord }

// onceTx is the transaction of [Store.RunOnce] and [Store.Complete] as the
// handler or effect sees it ([Tx]). The store begins it in the same round
// trip as the key's lock (and, in RunOnce, the look at its record), which
// pgx's own Begin cannot do, and ends it in the same round trip as the
// record's write; so this is the connection inside a transaction block,
// with nested transactions as savepoints, as pgx's are.
type onceTx struct {
	conn       *pgx.Conn
	savepoints int64
	endGuard
}

var (
	_ pgx.Tx = (*onceTx)(nil)
	_ pgx.Tx = (*onceSavepoint)(nil)
)

func (t *onceTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.savepoints++
	sp := &onceSavepoint{onceTx: t, tx: t, name: "pgstore_sp_" + strconv.FormatInt(t.savepoints, 10)}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

func (t *onceTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *onceTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not available inside RunOnce or Complete: pgx builds it only on a
// transaction of its own. Its methods panic (on a nil transaction), which
// rolls the request back.
func (t *onceTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *onceTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *onceTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *onceTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *onceTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
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
	if sp.closed {
		return pgx.ErrTxClosed
	}
	sp.closed = true
	_, err := sp.tx.conn.Exec(ctx, "RELEASE SAVEPOINT "+sp.name)
	return err
}

func (sp *onceSavepoint) Rollback(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	sp.closed = true
	_, err := sp.tx.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp.name)
	return err
}
