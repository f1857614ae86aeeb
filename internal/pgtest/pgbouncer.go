package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPgBouncer means that no pgbouncer program was found.
var ErrNoPgBouncer = errors.New("no pgbouncer on PATH or at /usr/sbin/pgbouncer")

// pgbouncerPaths are where pgbouncer is looked for after PATH: Debian's
// and Ubuntu's package puts it in /usr/sbin, which a user's PATH may lack.
var pgbouncerPaths = []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer"}

// PgBouncerOptions configures [PgBouncer].
type PgBouncerOptions struct {
	// PoolMode is PgBouncer's pool_mode. Empty means "transaction", the
	// mode that shares server connections between clients.
	PoolMode string
	// PoolSize is default_pool_size: how many server connections the
	// database gets. Zero means 2.
	PoolSize int
}

// PgBouncer starts a throwaway PgBouncer in front of the database of dsn
// (as [DSN] returns it) and returns the DSN of the same database through
// it. PgBouncer listens on 127.0.0.1 on a free port, lets any client in
// and logs in to the server as dsn's user. It is stopped, and its files
// deleted, when tb ends. As root, it runs as the "postgres" user, since
// PgBouncer refuses to run as root.
//
// Without a pgbouncer program (on PATH or in /usr/sbin) tb skips, or
// fails under IDEM_REQUIRE_POSTGRES=1.
func PgBouncer(tb testing.TB, dsn string, opts PgBouncerOptions) string {
	tb.Helper()
	bin, err := findPgBouncer()
	if err != nil {
		if os.Getenv(EnvRequire) != "1" {
			tb.Skipf("PgBouncer tests skipped: %v; install pgbouncer (%s=1 makes this a failure)", err, EnvRequire)
		}
		tb.Fatalf("pgtest: %s=1 and %v; install pgbouncer", EnvRequire, err)
	}
	b, err := startPgBouncer(bin, dsn, opts)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := b.stop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return b.dsn
}

func findPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range pgbouncerPaths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", ErrNoPgBouncer
}

// bouncer is a running PgBouncer.
type bouncer struct {
	dir  string
	dsn  string // through it
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the process's exit, once done is closed
}

func startPgBouncer(bin, dsn string, opts PgBouncerOptions) (*bouncer, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("start PgBouncer: %w", err)
	}
	run, err := runAs()
	if err != nil {
		return nil, err
	}
	mode := opts.PoolMode
	if mode == "" {
		mode = "transaction"
	}
	size := opts.PoolSize
	if size <= 0 {
		size = 2
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("start PgBouncer: find a free port: %w", err)
	}
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("start PgBouncer: %w", err)
	}
	b := &bouncer{dir: dir}
	if err := run.own(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start PgBouncer: give %s to its user: %w", dir, err)
	}
	server := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
	if cfg.Password != "" {
		server += " password=" + cfg.Password
	}
	// auth_type any: clients are not authenticated (the test is the only
	// client), and PgBouncer logs in as the database's user.
	ini := strings.Join([]string{
		"[databases]",
		cfg.Database + " = " + server,
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = any",
		"pool_mode = " + mode,
		"default_pool_size = " + strconv.Itoa(size),
		"max_client_conn = 1000",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
		"",
	}, "\n")
	conf := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start PgBouncer: %w", err)
	}
	b.cmd = exec.Command(bin, conf)
	b.cmd.Dir = dir
	out, err := os.Create(filepath.Join(dir, "pgbouncer.out"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start PgBouncer: %w", err)
	}
	defer out.Close()
	b.cmd.Stdout, b.cmd.Stderr = out, out
	run.apply(b.cmd)
	if err := b.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start PgBouncer: %w", err)
	}
	b.done = make(chan struct{})
	go func() { b.err = b.cmd.Wait(); close(b.done) }()
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Host: "127.0.0.1:" + strconv.Itoa(port), Path: "/" + cfg.Database,
		RawQuery: "sslmode=disable"}
	b.dsn = u.String()

	// Wait until it answers a query through to the server.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := ping(ctx, b.dsn)
		if err == nil {
			return b, nil
		}
		select {
		case <-b.done:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.out"))
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("start PgBouncer: it exited (%v):\n%s", b.err, log)
		case <-ctx.Done():
			_ = b.stop()
			return nil, fmt.Errorf("start PgBouncer: no answer after 30s: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ping connects to dsn and runs one query, without prepared statements.
func ping(ctx context.Context, dsn string) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(cctx, "SELECT 1")
	return err
}

// stop ends PgBouncer at once (SIGKILL: its server connections end with
// it, and the server rolls their transactions back) and deletes its files.
func (b *bouncer) stop() error {
	if b.cmd.Process != nil {
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("stop PgBouncer: remove %s: %w", b.dir, err)
	}
	return nil
}
