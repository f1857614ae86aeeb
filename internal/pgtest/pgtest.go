// Package pgtest gives tests a PostgreSQL database of their own.
//
// A test package calls [Main] from its TestMain and [DSN] from each test
// that needs a database:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		dsn := pgtest.DSN(t) // a new, empty database, dropped after t
//		...
//	}
//
// The server is the one named by IDEM_POSTGRES_DSN when it is set (its user
// must be allowed to create databases). Otherwise the first DSN call starts a
// throwaway server from the PostgreSQL binaries on the machine (initdb and
// postgres, on PATH or under /usr/lib/postgresql/*/bin), in a temporary
// directory, on a free port of 127.0.0.1, and Main stops it and deletes its
// files when the tests end. As root, the server runs as the "postgres" user,
// since PostgreSQL refuses to run as root.
//
// [PgBouncer] puts a throwaway PgBouncer (transaction pooling by default)
// in front of a test's database, for tests of what a pooler changes.
// [Start] gives a test a server of its own (to crash it, or with settings
// of its own), and [StartPair] a primary and a standby made from it by
// pg_basebackup, to make synchronous, cut off and fail over.
//
// Without a DSN and without binaries the tests that need PostgreSQL skip,
// saying how to enable them, unless IDEM_REQUIRE_POSTGRES=1, which makes
// them fail (CI sets it, so that CI never skips them).
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables that control where the database comes from.
const (
	EnvDSN     = "IDEM_POSTGRES_DSN"
	EnvRequire = "IDEM_REQUIRE_POSTGRES"
)

// enableHint is the one line a skipped test prints.
const enableHint = "PostgreSQL tests skipped: set " + EnvDSN + "=postgres://... or install the PostgreSQL server (initdb, postgres); " +
	EnvRequire + "=1 makes this a failure"

var (
	mu      sync.Mutex
	started bool
	server  *Server // the throwaway server, if one was started
	base    string  // DSN of the server's administrative database
	baseErr error
	dbSeq   atomic.Int64
)

// Main runs the tests of m and stops the throwaway server, if one was
// started, when they end. It returns m.Run's exit code.
func Main(m *testing.M) int {
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
		server = nil
	}
	return code
}

// serverDSN returns the DSN of the administrative database, starting the
// throwaway server on first use.
func serverDSN() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if started {
		return base, baseErr
	}
	started = true
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		base = dsn
		return base, nil
	}
	server, baseErr = Start(Options{})
	if baseErr == nil {
		base = server.DSN("postgres")
	}
	return base, baseErr
}

// DSN creates a new, empty database for tb and returns its DSN. The database
// is dropped when tb ends. Without PostgreSQL, DSN skips tb (or fails it
// under IDEM_REQUIRE_POSTGRES=1).
func DSN(tb testing.TB) string {
	tb.Helper()
	admin, err := serverDSN()
	if err != nil {
		if errors.Is(err, ErrNoBinaries) {
			if os.Getenv(EnvRequire) != "1" {
				tb.Skip(enableHint)
			}
			tb.Fatalf("pgtest: %s=1 and no PostgreSQL: %v; set %s=postgres://... or install the PostgreSQL server", EnvRequire, err, EnvDSN)
		}
		tb.Fatalf("pgtest: %v", err)
	}
	name := fmt.Sprintf("idem_test_%d_%d", os.Getpid(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exec1(ctx, admin, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := exec1(ctx, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	dsn, err := WithDatabase(admin, name)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return dsn
}

func exec1(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// WithDatabase returns dsn with its database replaced by name. dsn is a URL
// (postgres://...) or keyword/value settings (host=... dbname=...).
func WithDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("%s is not a valid URL: %w", EnvDSN, err)
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	// In keyword/value form the last setting of a keyword wins.
	return dsn + " dbname=" + name, nil
}

// ErrNoBinaries means that no PostgreSQL server binaries were found.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin")

// Options configures [Start].
type Options struct {
	// Durable keeps fsync and synchronous commit on, as a production server
	// has them; benchmarks and crash tests want it. Tests run faster
	// without.
	Durable bool
	// Settings are more server settings, "name=value" each, as
	// postgres -c takes them.
	Settings []string
}

// Server is a throwaway PostgreSQL server.
type Server struct {
	dir  string
	port int
	bin  string
	run  *account
	opts Options
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the server process's exit, once done is closed
}

// Start initialises a database cluster in a new temporary directory and
// starts a server on it, listening on 127.0.0.1 on a free port and on a unix
// socket in that directory. The superuser is "postgres" and needs no
// password. Call Stop to stop it and delete its files.
func Start(opts Options) (*Server, error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	run, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idem-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	s := &Server{dir: dir, bin: bin, run: run, opts: opts}
	if err := s.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	data := filepath.Join(s.dir, "data")
	if err := s.run.own(s.dir); err != nil {
		return fmt.Errorf("start PostgreSQL: give %s to the server's user: %w", s.dir, err)
	}
	initdb := exec.Command(filepath.Join(s.bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--locale=C", "--no-sync")
	initdb.Dir = s.dir
	s.run.apply(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("start PostgreSQL: initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return fmt.Errorf("start PostgreSQL: find a free port: %w", err)
	}
	s.port = port
	return s.launch()
}

// launch starts the server process on the data directory and waits until
// it accepts connections.
func (s *Server) launch() error {
	data := filepath.Join(s.dir, "data")
	args := []string{"-D", data, "-k", s.dir, "-h", "127.0.0.1", "-p", strconv.Itoa(s.port),
		"-c", "max_connections=300", "-c", "shared_buffers=128MB"}
	if !s.opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for _, kv := range s.opts.Settings {
		args = append(args, "-c", kv)
	}
	s.done = make(chan struct{})
	s.cmd = exec.Command(filepath.Join(s.bin, "postgres"), args...)
	s.cmd.Dir = s.dir
	logf, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	defer logf.Close()
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.run.apply(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()

	// Wait for it to accept connections.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, s.DSN("postgres"))
		ccancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
			return fmt.Errorf("start PostgreSQL: the server exited (%v):\n%s", s.err, log)
		case <-ctx.Done():
			_ = s.Stop()
			return fmt.Errorf("start PostgreSQL: not accepting connections after 60s: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DSN returns the URL of database db on the server.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Crash stops the server as a crash would (an immediate shutdown: the
// processes exit at once, nothing is flushed or checkpointed, and the next
// start recovers from the write-ahead log). Restart starts it again.
func (s *Server) Crash() error {
	if err := s.cmd.Process.Signal(crash); err != nil {
		return fmt.Errorf("crash PostgreSQL: %w", err)
	}
	<-s.done
	return nil
}

// Restart starts the server again, on the same files and port, after
// Crash, and waits until it accepts connections.
func (s *Server) Restart() error { return s.launch() }

// Stop stops the server (a fast shutdown: sessions are ended) and deletes
// its files.
func (s *Server) Stop() error {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(interrupt)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("stop PostgreSQL: remove %s: %w", s.dir, err)
	}
	return nil
}

// findBinaries returns the directory holding initdb and postgres: PATH
// first, then the newest /usr/lib/postgresql/*/bin.
func findBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob(binGlob)
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		_, err1 := os.Stat(filepath.Join(dir, "initdb"))
		_, err2 := os.Stat(filepath.Join(dir, "postgres"))
		if err1 == nil && err2 == nil {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

// binGlob is where the Debian and Ubuntu packages put the binaries of each
// major version.
var binGlob = "/usr/lib/postgresql/*/bin"

// version is the major version in /usr/lib/postgresql/N/bin.
func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// account is the user the server runs as: nil for the current user.
type account struct {
	uid, gid int
}

// runAs returns the account to run the server as: the "postgres" user when
// running as root, else the current user.
func runAs() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL: running as root, and PostgreSQL does not run as root: %w (create the postgres user or set %s)", err, EnvDSN)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &account{uid: uid, gid: gid}, nil
}

func (a *account) own(dir string) error {
	if a == nil {
		return nil
	}
	return os.Chown(dir, a.uid, a.gid)
}

// RandomToken returns n characters of base64url that look random, the
// same on every call: a credential that a database cannot compress, as a
// real token is (a repeated character compresses to fit any index).
func RandomToken(n int) string {
	var b strings.Builder
	block := sha256.Sum256([]byte("storetest"))
	for b.Len() < n {
		b.WriteString(base64.RawURLEncoding.EncodeToString(block[:]))
		block = sha256.Sum256(block[:])
	}
	return b.String()[:n]
}
