package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
)

// syncCommitSQL raises synchronous_commit to at least on for the rest of
// the transaction it runs in. It keeps remote_apply. A record the
// middleware acts on must survive a crash of the server. It must also
// survive a failover to a synchronous standby. The setting is local to
// the transaction (set_config's true). A session SET would outlive it,
// on a connection that a pooler hands to others.
const syncCommitSQL = `set_config('synchronous_commit',
	CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true)`

// recoveringSQL is true when the statement runs on a standby. A read there
// may miss a record the primary holds. So a read that decides an answer
// checks it in the read's own transaction. A pooler keeps a transaction
// on one server connection. Statements outside a transaction may go to
// different servers.
const recoveringSQL = `pg_is_in_recovery()`

// errRecovering is the error of a read that ran on a standby.
var errRecovering = fmt.Errorf("the database is a standby in recovery, which may not hold the latest records; nothing was decided: %w",
	idempotency.ErrUnavailable)

// errCanceledCommit is the error of a commit that reported success after
// its context ended (err). A canceled query ends a commit's wait for a
// synchronous standby. PostgreSQL then reports the commit done, with a
// warning. But the standby may not have it, and a failover may lose it.
// So nothing may depend on it.
func errCanceledCommit(err error) error {
	return fmt.Errorf("the request ended while the commit was confirmed, which may then not have reached a synchronous standby: %w", err)
}

// Keys of the marks [ConfigurePool] leaves in a connection's
// pgconn.PgConn.CustomData.
const (
	// canceledWaitMark marks a connection on which PostgreSQL warned that
	// a commit's wait for a synchronous standby was canceled.
	canceledWaitMark = "pgstore.canceled-sync-wait"
	// configuredMark marks a connection made by a pool that
	// ConfigurePool prepared.
	configuredMark = "pgstore.configured"
)

// canceledWaitMessage is the start of PostgreSQL's warning (syncrep.c)
// when a query cancel ends a commit's wait for a synchronous standby.
// pg_cancel_backend, a statement_timeout or a driver's cancel request
// does that. The commit has happened on the primary, and COMMIT reports
// success. This warning is the only sign. It is matched in English; see
// [ConfigurePool].
const canceledWaitMessage = "canceling wait for synchronous replication"

// ConfigurePool prepares cfg, before pgxpool.NewWithConfig, so that the
// store can see a commit whose wait for a synchronous standby was
// canceled. PostgreSQL reports such a commit done, with only a warning.
// Yet the standby may lack it, and a failover then loses it. An operator's
// pg_cancel_backend on a stuck commit does this.
//
// ConfigurePool wraps cfg.ConnConfig.OnNotice to mark the connection that
// gets the warning. Your own OnNotice still gets every notice. It wraps
// cfg.AfterConnect too, to mark each connection as prepared. The store
// answers a marked commit as one with no answer. The error then matches
// context.DeadlineExceeded, and the middleware answers 503 with
// Retry-After. The retry finds what committed.
//
// The warning is matched by its English text. So the store's role must
// see server messages in English (lc_messages C, POSIX or en_*).
// [Store.Check] warns otherwise. Call ConfigurePool once per
// configuration. docs/SERVER.md tells more, under "Durability and
// replication".
func ConfigurePool(cfg *pgxpool.Config) {
	notice := cfg.ConnConfig.OnNotice
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if n.SeverityUnlocalized == "WARNING" && strings.HasPrefix(n.Message, canceledWaitMessage) {
			c.CustomData()[canceledWaitMark] = true
		}
		if notice != nil {
			notice(c, n)
		}
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		c.PgConn().CustomData()[configuredMark] = true
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
}

// errCanceledWait is the error of a commit that PostgreSQL confirmed after
// its wait for a synchronous standby was canceled (see [ConfigurePool]).
// It matches context.DeadlineExceeded. Such a commit is as unconfirmed as
// one with no answer, and is answered so.
var errCanceledWait = fmt.Errorf("the commit's wait for a synchronous standby was canceled (pg_cancel_backend, or a statement_timeout), and the standby may not have it, so a failover may lose it: %w",
	context.DeadlineExceeded)

// beforeCommit clears c's mark of a canceled wait, which a commit made
// outside the store may have left.
func beforeCommit(c *pgconn.PgConn) { delete(c.CustomData(), canceledWaitMark) }

// afterCommit is errCanceledWait when the commit just made on c had its
// wait for a synchronous standby canceled, else nil. It clears the mark.
func afterCommit(c *pgconn.PgConn) error {
	_, canceled := c.CustomData()[canceledWaitMark]
	delete(c.CustomData(), canceledWaitMark)
	if canceled {
		return errCanceledWait
	}
	return nil
}

// readOnly wraps err with [idempotency.ErrUnavailable] when the database
// refused a write because it is read-only. That is a standby, or
// default_transaction_read_only. Nothing was written.
func readOnly(err error) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "25006" {
		return fmt.Errorf("%w: %w", idempotency.ErrUnavailable, err)
	}
	return err
}

// conflicted wraps err with [idempotency.ErrUnavailable] when the database
// rolled the transaction back. That is a serialization failure (40001) or
// a deadlock (40P01). They happen under a default_transaction_isolation of
// repeatable read or serializable, which the store leaves to the
// application. Nothing was committed, even for a 40001 at COMMIT. A retry
// with the key starts afresh. So the middleware answers 503 with
// Retry-After, never a 500.
func conflicted(err error) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") {
		return fmt.Errorf("%w: the transaction was rolled back on a conflict with another (SQLSTATE %s), nothing was committed: %w",
			idempotency.ErrUnavailable, pgErr.Code, err)
	}
	return err
}

// Replication declares how the database is replicated
// ([Options.Replication]). The store sees only the standbys that stream
// from its server. It sees whether they are synchronous only with
// pg_monitor (or pg_read_all_stats). A cascaded standby, or one fed by WAL
// archives, is invisible to it. So the operator declares the setup.
type Replication int

const (
	// ReplicationDetect (the zero value) looks. [Store.Check] refuses a
	// server with streaming standbys and none synchronous. It warns when
	// its role lacks pg_monitor and cannot tell. Use it for a single
	// server too.
	ReplicationDetect Replication = iota
	// ReplicationSynchronous declares that every standby a failover may
	// promote is synchronous. [Store.Check] refuses a server whose
	// synchronous_standby_names is empty.
	ReplicationSynchronous
	// ReplicationAsynchronous accepts the risk of asynchronous standbys.
	// A failover may lose records the middleware acted on. A retry then
	// runs the work again, and a provider may charge twice. [Store.Check]
	// does not look at replication.
	ReplicationAsynchronous
)

// Open returns a Store on pool, as [New] does, once [Store.Check] has
// found that the database keeps what the store commits. It fails when the
// check refuses the database, or cannot run.
func Open(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Store, error) {
	s := New(pool, opts)
	if err := s.Check(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Check looks at the database's settings that the store cannot force. A
// program calls it once at start; [Open] does. It refuses, with an error:
//   - fsync off: a crash of the machine loses commits, and may corrupt
//     the database;
//   - a standby in recovery: it takes no writes and may lag the primary;
//   - under [ReplicationDetect], standbys streaming from the server and
//     none synchronous: a failover to one loses the last commits;
//   - under [ReplicationSynchronous], an empty synchronous_standby_names.
//
// It warns to [Options.Logger] when pool was not prepared with
// [ConfigurePool]. It warns when the server's messages are not in
// English. A canceled wait for a standby would then go unseen. It warns
// when full_page_writes is off, which is safe only where storage writes a
// page atomically. Under [ReplicationDetect], it warns when its role
// cannot see whether standbys are synchronous. Grant the role pg_monitor,
// or declare the setup.
//
// A logical replication sender is not a standby. The store raises
// synchronous_commit for its own commits itself. So that setting is not
// checked.
func (s *Store) Check(ctx context.Context) error {
	var (
		fsync, fullPages, syncNames, messages string
		recovering, privileged                bool
		standbys, synchronous                 int
	)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: check the database: %w", err)
	}
	defer conn.Release()
	configured, _ := conn.Conn().PgConn().CustomData()[configuredMark].(bool)
	err = conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('full_page_writes'),
		current_setting('synchronous_standby_names'), current_setting('lc_messages'),
		pg_is_in_recovery(), pg_has_role('pg_read_all_stats', 'USAGE'),
		count(r.pid), count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum'))
		FROM pg_stat_replication r
		WHERE r.state IS DISTINCT FROM 'backup'
		AND NOT EXISTS (SELECT 1 FROM pg_replication_slots l WHERE l.active_pid = r.pid AND l.slot_type = 'logical')`).
		Scan(&fsync, &fullPages, &syncNames, &messages, &recovering, &privileged, &standbys, &synchronous)
	if err != nil {
		return fmt.Errorf("pgstore: check the database: %w", err)
	}
	if fsync != "on" {
		return errors.New("pgstore: refused: the database runs with fsync off, so a crash of its machine loses records the middleware acted on (and may corrupt the database); turn fsync on")
	}
	if recovering {
		return errors.New("pgstore: refused: the database is a standby in recovery; connect to the primary")
	}
	if !configured {
		s.warn(ctx, "pgstore: the pool was not prepared with pgstore.ConfigurePool: a commit whose wait for a synchronous standby an operator cancels (pg_cancel_backend) is taken for durable, and a failover may lose it")
	}
	if !englishMessages(messages) {
		s.warn(ctx, fmt.Sprintf("pgstore: lc_messages is %q: the store recognises a canceled wait for a synchronous standby by its English warning; set lc_messages to C for the store's role", messages))
	}
	if fullPages != "on" {
		s.warn(ctx, "pgstore: full_page_writes is off: a crash may tear a page of the records table unless the storage writes pages atomically")
	}
	switch s.replication {
	case ReplicationSynchronous:
		if strings.TrimSpace(syncNames) == "" {
			return errors.New("pgstore: refused: Options.Replication declares synchronous standbys, and synchronous_standby_names is empty, so no commit waits for a standby")
		}
	case ReplicationDetect:
		switch {
		case standbys > 0 && !privileged:
			s.warn(ctx, fmt.Sprintf("pgstore: %d standby(s) stream from the database, and the store's role cannot see whether any is synchronous: grant it pg_monitor, or declare the setup in Options.Replication", standbys))
		case standbys > 0 && synchronous == 0:
			return fmt.Errorf("pgstore: refused: %d standby(s) stream from the database and none is synchronous: a failover to one loses the last records, and a retry runs the work again; make one synchronous (synchronous_standby_names), or accept the risk with Options.Replication = ReplicationAsynchronous", standbys)
		}
	}
	return nil
}

// englishMessages reports whether the server's messages in locale
// lc_messages are in English. That is C, POSIX, en_*, or empty, which
// means the server's environment.
func englishMessages(lc string) bool {
	return lc == "" || lc == "C" || lc == "POSIX" || strings.HasPrefix(lc, "C.") || strings.HasPrefix(lc, "en")
}

// warn logs msg at the warning level to the store's logger.
func (s *Store) warn(ctx context.Context, msg string) {
	s.logger.LogAttrs(ctx, slog.LevelWarn, msg)
}
