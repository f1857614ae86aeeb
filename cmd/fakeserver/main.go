// Command fakeserver runs the idem fake payment server, which implements the
// server side of the Idempotency-Key contract, for testing clients in any
// language. Run it with -h for the flags and admin endpoints.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/pgfake"
	"github.com/idemkit/idem/idempotency/pgstore"
)

const usage = `Usage: fakeserver [flags]

Runs a fake payment API that implements the Idempotency-Key contract
exactly, faults included, for testing clients in any language.

The first log line on stderr is "listening addr=HOST:PORT"; with
-addr 127.0.0.1:0 the port is chosen by the system and read from there.
Then one line per request (method, path, key, status, outcome).

API:
  POST /payments                      Idempotency-Key required
  GET  /payments, /payments/{id}      caller-scoped (see Callers)
  GET  /payments?idempotency_key=K    the payment made under K; 409 while K is
                                      unsettled (resend with K); 404 if never done
  PUT  /orders/{id}/status            naturally idempotent, key ignored

Callers: keys and payments belong to the account a request acts for. A
test token names its account: "Authorization: Bearer test_<account>_<any>"
(account: 1-64 letters, digits, '-', '.'), so a token refreshed between
attempts is the same caller and its retry replays. Any other Authorization
value is a caller of its own; none is the anonymous caller. Only digests
of callers are stored.

Admin endpoints (no key, no scoping):
  GET    /_fake/stats    {"payments","provider_charges","executions","records","in_progress","requests"}
  POST   /_fake/faults   {"fault","key","path","count","delay_ms","status","retry_after"}
                         faults: drop_response, delay, crash_after_insert,
                         crash_after_provider, error, status, reset
  DELETE /_fake/faults   clear all faults
  POST   /_fake/sweep    delete expired records
  POST   /_fake/reset    forget everything

Memory is bounded by -max-records, -max-payments and -max-orders. A
payment with its record takes about 2 KB, plus twice its description (at
most 1000 characters) and its Authorization header (request headers are
limited to 16 KiB). When the record or payment cap is reached, POST
/payments answers 503 with type https://idem.dev/problems/storage-full and
stores and charges nothing: an Idempotency-Key client retries it as an
unknown outcome, and its lookup (GET /payments?idempotency_key=K) answers
404, never done. Records free up as they expire (Retry-After says when);
payments and orders only with POST /_fake/reset.

Slow clients are disconnected after the timeouts below.

With -tls FILE it serves HTTPS with a self-signed certificate made at
start for -tls-hosts, and writes the certificate (PEM) to FILE, for a phone
emulator or simulator to trust (Android blocks cleartext, iOS has ATS).
With -tls-key KEYFILE too, the key is kept there and later starts reuse
both files, so the device's trust survives a restart. The log line "tls
certificate" gives its names, expiry and SHA-256 fingerprint.

With -postgres DSN the records, payments, the fake provider's charges,
order statuses and the counters are kept in that PostgreSQL database (its
tables are created at start), so that several fakeserver processes on one
database act as one server: /_fake/stats on any of them reports the
database's totals. Faults stay per process, and the -max-* bounds, which
bound memory, do not apply.

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// maxHeaderBytes bounds a request's headers; the Authorization header is
// kept with every record and payment.
const maxHeaderBytes = 16 << 10

// run is the program; it returns the exit code.
func run(args []string, stderr io.Writer) int {
	c, code := parseFlags(args, stderr)
	if c == nil {
		return code
	}
	return serve(c, slog.New(slog.NewTextHandler(stderr, nil)))
}

// config is the program's settings, from its flags.
type config struct {
	addr, keyFormat, postgres           string
	retention, lease, delay, sweepEvery time.Duration
	readHeaderTimeout, readTimeout      time.Duration
	writeTimeout, idleTimeout           time.Duration
	shutdownTimeout                     time.Duration
	maxRecords, maxPayments, maxOrders  int
	tlsCert, tlsKey, tlsHosts           string
	// hosts is -tls-hosts parsed.
	hosts []string
}

// parseFlags reads and checks the flags. A nil config means the program
// ends now, with the exit code: 0 after -h, 2 for bad flags. It explains
// bad flags on stderr.
func parseFlags(args []string, stderr io.Writer) (*config, int) {
	c := &config{}
	fs := flag.NewFlagSet("fakeserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "address to listen on; port 0 picks a free one")
	fs.DurationVar(&c.retention, "retention", 24*time.Hour, "how long idempotency records live, from their creation")
	fs.DurationVar(&c.lease, "lease", 30*time.Second, "IN_PROGRESS lease; after it another request may take a record over")
	fs.DurationVar(&c.delay, "processing-delay", 0, "time each payment takes")
	fs.StringVar(&c.keyFormat, "key-format", "any", `accepted Idempotency-Key format: "any" (compared byte for byte) or "uuid" (compared in any case)`)
	fs.DurationVar(&c.sweepEvery, "sweep-every", time.Minute, "how often expired records are deleted; 0 disables")
	fs.DurationVar(&c.readHeaderTimeout, "read-header-timeout", 10*time.Second, "longest time to read a request's headers")
	fs.DurationVar(&c.readTimeout, "read-timeout", 30*time.Second, "longest time to read a request, body included; a slower client is disconnected")
	fs.DurationVar(&c.writeTimeout, "write-timeout", time.Minute, "longest time from the end of a request's headers to the end of its answer; keep it over\n-processing-delay (an answer later than this, such as one held by a delay fault, is lost)")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", time.Minute, "how long an idle keep-alive connection is kept open")
	fs.IntVar(&c.maxRecords, "max-records", 100000, "idempotency records held at most; then a new key gets 503 storage-full with\nRetry-After until the earliest record expires (nothing stored or charged)")
	fs.IntVar(&c.maxPayments, "max-payments", 100000, "payments held at most (they do not expire); then a new payment gets 503\nstorage-full before anything is charged, until POST /_fake/reset")
	fs.IntVar(&c.maxOrders, "max-orders", 100000, "order statuses held at most; then a status for a new order gets 503 storage-full")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long requests in flight may finish before their\nconnections are closed; the program then exits 0")
	fs.StringVar(&c.tlsCert, "tls", "", "serve HTTPS (HTTP/1.1) with a self-signed certificate made at start, and write\nthe certificate (PEM) to this file, for a device or emulator to trust")
	fs.StringVar(&c.tlsKey, "tls-key", "", "with -tls: keep the certificate's private key in this file (mode 0600), and on\nlater starts serve the certificate and key these files hold, so a device's trust\nsurvives a restart")
	fs.StringVar(&c.tlsHosts, "tls-hosts", defaultTLSHosts, "with -tls: the host names and IP addresses the new certificate names,\ncomma-separated (10.0.2.2 is the host as the Android emulator reaches it)")
	fs.StringVar(&c.postgres, "postgres", "", "PostgreSQL DSN (postgres://user:pass@host/db or keyword=value); empty keeps the state in memory")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	err := c.check(fs.Args())
	if err == nil {
		c.hosts, err = parseHosts(c.tlsHosts)
	}
	if err != nil {
		fmt.Fprintf(stderr, "fakeserver: %v\n", err)
		return nil, 2
	}
	return c, 0
}

// check refuses settings that cannot work together. It refuses arguments
// too: the program takes none.
func (c *config) check(args []string) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("unexpected argument %q; see -h", args[0])
	case c.retention <= 0:
		return fmt.Errorf("-retention must be positive, not %v", c.retention)
	case c.lease <= 0:
		return fmt.Errorf("-lease must be positive, not %v", c.lease)
	case c.retention <= c.lease:
		return fmt.Errorf("-retention (%v) must be longer than -lease (%v): a record must not expire under its live worker", c.retention, c.lease)
	case c.delay < 0:
		return fmt.Errorf("-processing-delay must not be negative, not %v", c.delay)
	case c.lease <= c.delay:
		return fmt.Errorf("-lease (%v) must be longer than -processing-delay (%v): a payment still running would be taken over by its resend and run twice", c.lease, c.delay)
	case c.sweepEvery < 0:
		return fmt.Errorf("-sweep-every must not be negative, not %v", c.sweepEvery)
	case c.readHeaderTimeout <= 0, c.readTimeout <= 0, c.writeTimeout <= 0, c.idleTimeout <= 0, c.shutdownTimeout <= 0:
		return errors.New("-read-header-timeout, -read-timeout, -write-timeout, -idle-timeout and -shutdown-timeout must be positive")
	case c.maxRecords <= 0, c.maxPayments <= 0, c.maxOrders <= 0:
		return errors.New("-max-records, -max-payments and -max-orders must be positive")
	case c.writeTimeout <= c.delay:
		return fmt.Errorf("-write-timeout (%v) must be longer than -processing-delay (%v), or every answer is lost", c.writeTimeout, c.delay)
	case c.keyFormat != "any" && c.keyFormat != "uuid":
		return fmt.Errorf(`-key-format must be "any" or "uuid", not %q`, c.keyFormat)
	case c.tlsCert == "" && (c.tlsKey != "" || c.tlsHosts != defaultTLSHosts):
		return errors.New("-tls-key and -tls-hosts need -tls FILE, where the certificate is written")
	case c.tlsCert != "" && c.tlsCert == c.tlsKey:
		return errors.New("-tls and -tls-key must be two files")
	}
	return nil
}

// serve runs the server until SIGTERM or SIGINT, then drains it. It
// returns the exit code.
func serve(c *config, logger *slog.Logger) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := c.options(logger)
	// life bounds the database work of every request and sweep: abort ends
	// it when the drain time is over.
	life, abort := context.WithCancel(context.Background())
	defer abort()
	var pool *pgxpool.Pool
	if c.postgres != "" {
		var err error
		if pool, err = openPostgres(ctx, c.postgres); err != nil {
			logger.Error("cannot use the database", "err", err)
			return 1
		}
		defer pool.Close() // after an early return; once shut down, closed already
		opts.Storage = pgfake.New(life, pool)
	}
	h := fakeserver.NewHandler(opts)
	cert, certMade, err := c.certificate()
	if err != nil {
		logger.Error("cannot use TLS", "err", err)
		return 1
	}
	ln, err := listen(c.addr, cert)
	if err != nil {
		logger.Error("cannot listen", "addr", c.addr, "err", err)
		return 1
	}
	srv := c.server(h, logger)
	logListening(logger, ln.Addr(), c.tlsCert, cert, certMade)

	sweeping := make(chan struct{})
	go func() {
		defer close(sweeping)
		sweep(ctx, h, c.sweepEvery)
	}()
	if err := serveUntil(ctx, srv, ln); err != nil {
		logger.Error("server failed", "err", err)
		return 1
	}
	stop() // a second signal ends the program at once
	drain(srv, c.shutdownTimeout, abort, logger)
	abort() // the sweeper's work too
	<-sweeping
	if pool != nil {
		// Waits for the cancelled statements: nothing commits after
		// "stopped".
		pool.Close()
	}
	logger.Info("stopped")
	return 0
}

// options are the fake server's options from the flags, in memory.
func (c *config) options(logger *slog.Logger) *fakeserver.Options {
	return &fakeserver.Options{
		Retention:       c.retention,
		Lease:           c.lease,
		ProcessingDelay: c.delay,
		RequireUUID:     c.keyFormat == "uuid",
		Logger:          logger,
		MaxRecords:      c.maxRecords,
		MaxPayments:     c.maxPayments,
		MaxOrders:       c.maxOrders,
	}
}

// certificate returns the certificate to serve, and whether it is new;
// none without -tls. It is on disk before the server listens: a script
// that waits for "listening" finds it there.
func (c *config) certificate() (*tls.Certificate, bool, error) {
	if c.tlsCert == "" {
		return nil, false, nil
	}
	cert, made, err := serverCert(c.tlsCert, c.tlsKey, c.hosts, time.Now())
	if err != nil {
		return nil, false, err
	}
	return &cert, made, nil
}

// server returns the HTTP server of h. Every timeout is set, so a client
// that sends slowly, or not at all, holds a connection for a bounded time.
func (c *config) server(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.readHeaderTimeout,
		ReadTimeout:       c.readTimeout,
		WriteTimeout:      c.writeTimeout,
		IdleTimeout:       c.idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// logListening logs where the server listens. With TLS it logs what a
// device must trust: the certificate's file, names, expiry and fingerprint.
func logListening(logger *slog.Logger, addr net.Addr, certFile string, cert *tls.Certificate, certMade bool) {
	scheme := "http"
	if cert != nil {
		scheme = "https"
	}
	logger.Info("listening", "addr", addr.String(), "scheme", scheme)
	if cert != nil {
		logger.Info("tls certificate", "file", certFile, "new", certMade,
			"names", slices.Concat(cert.Leaf.DNSNames, ipStrings(cert.Leaf.IPAddresses)),
			"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339), "sha256", fingerprint(cert.Leaf.Raw))
	}
}

// serveUntil serves on ln until ctx is done, then returns nil. It returns
// the error that stopped the server before that.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	}
}

// drain shuts srv down: requests in flight have timeout to finish.
func drain(srv *http.Server, timeout time.Duration, abort context.CancelFunc, logger *slog.Logger) {
	logger.Info("shutting down", "drain", timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		// Requests still in flight (a slow client, a delay fault, a commit
		// waiting on a lock) are cut off: the program was asked to stop,
		// and stops. Their database work is cancelled, and nothing they
		// did commits from here on.
		logger.Warn("drain time over; closing the remaining connections", "err", err)
		abort()
		_ = srv.Close()
	}
}

// sweep calls h.Sweep every interval (real time) until ctx is done; a
// zero interval never sweeps.
func sweep(ctx context.Context, h *fakeserver.Handler, every time.Duration) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.Sweep()
		}
	}
}

// listen listens on addr, over TLS with cert when it is not nil. TLS is
// HTTP/1.1 only, as httptest's TLS server: the faults close the
// connection, which in HTTP/2 would reset one stream.
func listen(addr string, cert *tls.Certificate) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil || cert == nil {
		return ln, err
	}
	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"http/1.1"}}), nil
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

// openPostgres connects to dsn and creates the fake server's tables. The
// first connection must succeed within 10 seconds.
func openPostgres(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("-postgres: %w", err)
	}
	// The store sees a commit whose wait for a synchronous standby was
	// canceled, and answers it 503.
	pgstore.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("-postgres: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pgfake.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
