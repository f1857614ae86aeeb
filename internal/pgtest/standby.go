package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a primary and a standby made from it the ordinary way:
// pg_basebackup -R, streaming replication, asynchronous until
// [Pair.MakeSynchronous]. The tests of replication and failover use it.
type Pair struct {
	Primary, Standby *Server
	paused           []int // the primary's WAL senders that PauseReplication stopped
}

// StartPair starts a primary with opts (see [Start]) and a standby of it,
// and waits until the standby streams from the primary. Call Stop to stop
// both and delete their files.
func StartPair(opts Options) (*Pair, error) {
	primary, err := Start(opts)
	if err != nil {
		return nil, err
	}
	p := &Pair{Primary: primary}
	if err := p.startStandby(opts); err != nil {
		_ = primary.Stop()
		return nil, err
	}
	return p, nil
}

func (p *Pair) startStandby(opts Options) error {
	dir, err := os.MkdirTemp("", "idem-pgtest-standby-")
	if err != nil {
		return fmt.Errorf("start a standby: %w", err)
	}
	s := &Server{dir: dir, bin: p.Primary.bin, run: p.Primary.run, opts: opts}
	if err := s.run.own(dir); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("start a standby: give %s to the server's user: %w", dir, err)
	}
	basebackup, err := tool(s.bin, "pg_basebackup")
	if err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("start a standby: %w", err)
	}
	backup := exec.Command(basebackup, "-D", filepath.Join(dir, "data"), "-R",
		"-X", "stream", "-c", "fast", "--no-sync", "-h", "127.0.0.1", "-p", strconv.Itoa(p.Primary.port), "-U", "postgres")
	backup.Dir = dir
	s.run.apply(backup)
	if out, err := backup.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("start a standby: pg_basebackup: %w\n%s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("start a standby: find a free port: %w", err)
	}
	if err := s.launch(); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	p.Standby = s
	return p.await("the standby to stream", `SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'`)
}

// Tool returns the path of the PostgreSQL client program name
// (pg_recvlogical, psql), found as the server's binaries are.
func (s *Server) Tool(name string) (string, error) { return tool(s.bin, name) }

// Port returns the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// tool returns the path of the PostgreSQL program name: beside the server
// binaries in bin, or beside the files they link to (a PATH directory may
// hold links to initdb and postgres only), or on PATH.
func tool(bin, name string) (string, error) {
	if p := filepath.Join(bin, name); exists(p) {
		return p, nil
	}
	if real, err := filepath.EvalSymlinks(filepath.Join(bin, "postgres")); err == nil {
		if p := filepath.Join(filepath.Dir(real), name); exists(p) {
			return p, nil
		}
	}
	return exec.LookPath(name)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// await polls the primary with query, a SELECT of one boolean, until it is
// true, for at most a minute.
func (p *Pair) await(what, query string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return poll(ctx, p.Primary.DSN("postgres"), what, query)
}

func poll(ctx context.Context, dsn, what, query string) error {
	for {
		ok, err := queryBool(ctx, dsn, query)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waited for %s: %v (last error: %v)", what, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func queryBool(ctx context.Context, dsn, query string) (bool, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	var ok bool
	err = conn.QueryRow(ctx, query).Scan(&ok)
	return ok, err
}

// MakeSynchronous names the standby in the primary's
// synchronous_standby_names ('*') and waits until the primary sees it as
// synchronous: from then on a commit with synchronous_commit on waits until
// the standby has flushed it.
func (p *Pair) MakeSynchronous() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := p.Primary.DSN("postgres")
	if err := exec1(ctx, dsn, "ALTER SYSTEM SET synchronous_standby_names = '*'"); err != nil {
		return fmt.Errorf("pgtest: make the standby synchronous: %w", err)
	}
	if err := exec1(ctx, dsn, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: make the standby synchronous: %w", err)
	}
	return p.await("the standby to be synchronous", `SELECT count(*) > 0 FROM pg_stat_replication WHERE sync_state = 'sync'`)
}

// PauseReplication stops the primary's WAL senders (SIGSTOP), as a network
// that holds back everything sent to the standby would: the standby
// receives nothing more, and a commit that waits for it waits, until
// ResumeReplication or, after Failover, for ever.
func (p *Pair) PauseReplication() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.Primary.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: pause replication: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		return fmt.Errorf("pgtest: pause replication: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("pgtest: pause replication: %w", err)
	}
	if len(pids) == 0 {
		return fmt.Errorf("pgtest: pause replication: no WAL sender")
	}
	for _, pid := range pids {
		if err := pause(int(pid)); err != nil {
			return fmt.Errorf("pgtest: pause the WAL sender %d: %w", pid, err)
		}
		p.paused = append(p.paused, int(pid))
	}
	return nil
}

// ResumeReplication lets the WAL senders that PauseReplication stopped go
// on.
func (p *Pair) ResumeReplication() error {
	for _, pid := range p.paused {
		if err := resume(pid); err != nil {
			return fmt.Errorf("pgtest: resume the WAL sender %d: %w", pid, err)
		}
	}
	p.paused = nil
	return nil
}

// Failover crashes the primary (an immediate shutdown, as [Server.Crash])
// and promotes the standby, waiting until it takes writes. A WAL sender
// that PauseReplication stopped dies with the primary without sending
// anything more: what the standby had not received is lost, as in a real
// failover.
func (p *Pair) Failover() error {
	if err := p.Primary.cmd.Process.Signal(crash); err != nil {
		return fmt.Errorf("pgtest: crash the primary: %w", err)
	}
	for _, pid := range p.paused {
		_ = kill(pid) // after the crash began: the postmaster does not restart
	}
	p.paused = nil
	<-p.Primary.done
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exec1(ctx, p.Standby.DSN("postgres"), "SELECT pg_promote(true, 60)"); err != nil {
		return fmt.Errorf("pgtest: promote the standby: %w", err)
	}
	return poll(ctx, p.Standby.DSN("postgres"), "the standby to be promoted", `SELECT NOT pg_is_in_recovery()`)
}

// Stop stops both servers, the primary even after Failover, and deletes
// their files.
func (p *Pair) Stop() error {
	_ = p.ResumeReplication()
	errS := p.Standby.Stop()
	if err := p.Primary.Stop(); err != nil {
		return err
	}
	return errS
}
