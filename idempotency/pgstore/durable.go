package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
)

// syncCommitSQL raises synchronous_commit to at least on for the rest of
// the transaction it runs in, and keeps remote_apply. A record the
// middleware acts on (an IN_PROGRESS record before the handler runs, a
// COMPLETED record before its answer is sent) must survive a crash of the
// server, and a failover to a synchronous standby. The setting is local to
// the transaction (set_config's true): a session SET would outlive it on a
// connection that a pooler hands to others.
const syncCommitSQL = `set_config('synchronous_commit',
	CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true)`

// recoveringSQL is true when the statement runs on a standby. A read there
// may miss a record the primary holds: a read that decides an answer
// checks it in the same statement, since a pooler may send each statement
// to another server.
const recoveringSQL = `pg_is_in_recovery()`

// errRecovering is the error of a read that ran on a standby.
var errRecovering = fmt.Errorf("the database is a standby in recovery, which may not hold the latest records; nothing was decided: %w",
	idempotency.ErrUnavailable)

// errCanceledCommit is the error of a commit that reported success after
// its context ended (err). PostgreSQL ends a commit's wait for a
// synchronous standby when the query is canceled (a pool that sends a
// cancel request on a context's end), and reports the commit done with a
// warning, though the standby may not have it: a failover may lose it. So
// nothing may depend on it.
func errCanceledCommit(err error) error {
	return fmt.Errorf("the request ended while the commit was confirmed, which may then not have reached a synchronous standby: %w", err)
}

// readOnly wraps err with [idempotency.ErrUnavailable] when the database
// refused a write because it is read-only (a standby, or
// default_transaction_read_only): nothing was written.
func readOnly(err error) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "25006" {
		return fmt.Errorf("%w: %w", idempotency.ErrUnavailable, err)
	}
	return err
}

// conflicted wraps err with [idempotency.ErrUnavailable] when the database
// rolled the transaction back on a serialization failure (40001) or a
// deadlock (40P01). Under a default_transaction_isolation of repeatable
// read or serializable, which the store leaves to the application, a
// transaction that meets another's commit fails so. Nothing was
// committed (a 40001 at COMMIT is a transaction that did not commit), and
// a retry with the key starts afresh: the middleware answers 503 with
// Retry-After, never a 500.
func conflicted(err error) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") {
		return fmt.Errorf("%w: the transaction was rolled back on a conflict with another (SQLSTATE %s), nothing was committed: %w",
			idempotency.ErrUnavailable, pgErr.Code, err)
	}
	return err
}

// Replication declares how the database is replicated ([Options.Replication]).
// The store sees only the standbys that stream from its server, and sees
// whether they are synchronous only with the privileges of pg_monitor (or
// pg_read_all_stats). A cascaded standby, or one fed by WAL archives, is
// invisible to it. So the operator declares the setup.
type Replication int

const (
	// ReplicationDetect (the zero value) looks: [Store.Check] refuses a
	// server with standbys streaming from it and none synchronous, and
	// warns when it cannot tell (its role lacks pg_monitor). Use it for a
	// single server too.
	ReplicationDetect Replication = iota
	// ReplicationSynchronous declares that every standby a failover may
	// promote is synchronous (synchronous_standby_names names it).
	// [Store.Check] refuses a server whose synchronous_standby_names is
	// empty.
	ReplicationSynchronous
	// ReplicationAsynchronous accepts the risk of asynchronous standbys:
	// a failover may lose records the middleware acted on, and a retry
	// then runs the work again (a provider may charge twice).
	// [Store.Check] does not look at replication.
	ReplicationAsynchronous
)

// Open returns a Store on pool, as [New] does, after [Store.Check] has
// found that the database keeps what the store commits. It fails when the
// check refuses the database, or cannot run.
func Open(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Store, error) {
	s := New(pool, opts)
	if err := s.Check(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Check looks at the database's settings that the store cannot force, as
// a program does once at start ([Open] calls it). It refuses, with an
// error:
//   - fsync off: a crash of the machine loses commits, and may corrupt
//     the database;
//   - a standby in recovery: it takes no writes and may lag the primary;
//   - under [ReplicationDetect], standbys streaming from the server and
//     none synchronous: a failover to one loses the last commits;
//   - under [ReplicationSynchronous], an empty synchronous_standby_names.
//
// It warns, to [Options.Logger], when full_page_writes is off (safe only
// where the storage writes a page atomically) and when, under
// [ReplicationDetect], standbys stream from the server and its role cannot
// see whether they are synchronous (grant it pg_monitor, or declare the
// setup). A logical replication sender is not a standby, and is not
// counted.
//
// The store raises synchronous_commit for its own commits itself, so the
// server's and the role's settings of it are not checked.
func (s *Store) Check(ctx context.Context) error {
	var (
		fsync, fullPages, syncNames string
		recovering, privileged      bool
		standbys, synchronous       int
	)
	err := s.pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('full_page_writes'),
		current_setting('synchronous_standby_names'), pg_is_in_recovery(), pg_has_role('pg_read_all_stats', 'USAGE'),
		count(r.pid), count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum'))
		FROM pg_stat_replication r
		WHERE r.state IS DISTINCT FROM 'backup'
		AND NOT EXISTS (SELECT 1 FROM pg_replication_slots l WHERE l.active_pid = r.pid AND l.slot_type = 'logical')`).
		Scan(&fsync, &fullPages, &syncNames, &recovering, &privileged, &standbys, &synchronous)
	if err != nil {
		return fmt.Errorf("pgstore: check the database: %w", err)
	}
	if fsync != "on" {
		return errors.New("pgstore: refused: the database runs with fsync off, so a crash of its machine loses records the middleware acted on (and may corrupt the database); turn fsync on")
	}
	if recovering {
		return errors.New("pgstore: refused: the database is a standby in recovery; connect to the primary")
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

// warn logs msg at the warning level to the store's logger.
func (s *Store) warn(ctx context.Context, msg string) {
	s.logger.LogAttrs(ctx, slog.LevelWarn, msg)
}
