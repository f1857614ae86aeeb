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
	fs := flag.NewFlagSet("fakeserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on; port 0 picks a free one")
	retention := fs.Duration("retention", 24*time.Hour, "how long idempotency records live, from their creation")
	lease := fs.Duration("lease", 30*time.Second, "IN_PROGRESS lease; after it another request may take a record over")
	delay := fs.Duration("processing-delay", 0, "time each payment takes")
	keyFormat := fs.String("key-format", "any", `accepted Idempotency-Key format: "any" (compared byte for byte) or "uuid" (compared in any case)`)
	sweepEvery := fs.Duration("sweep-every", time.Minute, "how often expired records are deleted; 0 disables")
	readHeaderTimeout := fs.Duration("read-header-timeout", 10*time.Second, "longest time to read a request's headers")
	readTimeout := fs.Duration("read-timeout", 30*time.Second, "longest time to read a request, body included; a slower client is disconnected")
	writeTimeout := fs.Duration("write-timeout", time.Minute, "longest time from the end of a request's headers to the end of its answer; keep it over\n-processing-delay (an answer later than this, such as one held by a delay fault, is lost)")
	idleTimeout := fs.Duration("idle-timeout", time.Minute, "how long an idle keep-alive connection is kept open")
	maxRecords := fs.Int("max-records", 100000, "idempotency records held at most; then a new key gets 503 storage-full with\nRetry-After until the earliest record expires (nothing stored or charged)")
	maxPayments := fs.Int("max-payments", 100000, "payments held at most (they do not expire); then a new payment gets 503\nstorage-full before anything is charged, until POST /_fake/reset")
	maxOrders := fs.Int("max-orders", 100000, "order statuses held at most; then a status for a new order gets 503 storage-full")
	shutdownTimeout := fs.Duration("shutdown-timeout", 10*time.Second, "on SIGTERM or SIGINT, how long requests in flight may finish before their\nconnections are closed; the program then exits 0")
	tlsCert := fs.String("tls", "", "serve HTTPS (HTTP/1.1) with a self-signed certificate made at start, and write\nthe certificate (PEM) to this file, for a device or emulator to trust")
	tlsKey := fs.String("tls-key", "", "with -tls: keep the certificate's private key in this file (mode 0600), and on\nlater starts serve the certificate and key these files hold, so a device's trust\nsurvives a restart")
	tlsHosts := fs.String("tls-hosts", defaultTLSHosts, "with -tls: the host names and IP addresses the new certificate names,\ncomma-separated (10.0.2.2 is the host as the Android emulator reaches it)")
	postgres := fs.String("postgres", "", "PostgreSQL DSN (postgres://user:pass@host/db or keyword=value); empty keeps the state in memory")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fakeserver: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return bad("unexpected argument %q; see -h", fs.Arg(0))
	case *retention <= 0:
		return bad("-retention must be positive, not %v", *retention)
	case *lease <= 0:
		return bad("-lease must be positive, not %v", *lease)
	case *retention <= *lease:
		return bad("-retention (%v) must be longer than -lease (%v): a record must not expire under its live worker", *retention, *lease)
	case *delay < 0:
		return bad("-processing-delay must not be negative, not %v", *delay)
	case *lease <= *delay:
		return bad("-lease (%v) must be longer than -processing-delay (%v): a payment still running would be taken over by its resend and run twice", *lease, *delay)
	case *sweepEvery < 0:
		return bad("-sweep-every must not be negative, not %v", *sweepEvery)
	case *readHeaderTimeout <= 0, *readTimeout <= 0, *writeTimeout <= 0, *idleTimeout <= 0, *shutdownTimeout <= 0:
		return bad("-read-header-timeout, -read-timeout, -write-timeout, -idle-timeout and -shutdown-timeout must be positive")
	case *maxRecords <= 0, *maxPayments <= 0, *maxOrders <= 0:
		return bad("-max-records, -max-payments and -max-orders must be positive")
	case *writeTimeout <= *delay:
		return bad("-write-timeout (%v) must be longer than -processing-delay (%v), or every answer is lost", *writeTimeout, *delay)
	case *keyFormat != "any" && *keyFormat != "uuid":
		return bad(`-key-format must be "any" or "uuid", not %q`, *keyFormat)
	case *tlsCert == "" && (*tlsKey != "" || *tlsHosts != defaultTLSHosts):
		return bad("-tls-key and -tls-hosts need -tls FILE, where the certificate is written")
	case *tlsCert != "" && *tlsCert == *tlsKey:
		return bad("-tls and -tls-key must be two files")
	}
	hosts, err := parseHosts(*tlsHosts)
	if err != nil {
		return bad("%v", err)
	}

	logger := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := &fakeserver.Options{
		Retention:       *retention,
		Lease:           *lease,
		ProcessingDelay: *delay,
		RequireUUID:     *keyFormat == "uuid",
		Logger:          logger,
		MaxRecords:      *maxRecords,
		MaxPayments:     *maxPayments,
		MaxOrders:       *maxOrders,
	}
	// life bounds the database work of every request and sweep: abort ends
	// it when the drain time is over.
	life, abort := context.WithCancel(context.Background())
	defer abort()
	var pool *pgxpool.Pool
	if *postgres != "" {
		var err error
		if pool, err = openPostgres(ctx, *postgres); err != nil {
			logger.Error("cannot use the database", "err", err)
			return 1
		}
		defer pool.Close() // after an early return; once shut down, closed already
		opts.Storage = pgfake.New(life, pool)
	}
	h := fakeserver.NewHandler(opts)
	var cert tls.Certificate
	var certMade bool
	if *tlsCert != "" {
		// The certificate is on disk before the server listens: a script
		// that waits for "listening" finds it there.
		if cert, certMade, err = serverCert(*tlsCert, *tlsKey, hosts, time.Now()); err != nil {
			logger.Error("cannot use TLS", "err", err)
			return 1
		}
	}
	var certp *tls.Certificate
	if *tlsCert != "" {
		certp = &cert
	}
	ln, err := listen(*addr, certp)
	if err != nil {
		logger.Error("cannot listen", "addr", *addr, "err", err)
		return 1
	}
	// Every timeout is set, so a client that sends slowly, or not at all,
	// holds a connection for a bounded time.
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: *readHeaderTimeout,
		ReadTimeout:       *readTimeout,
		WriteTimeout:      *writeTimeout,
		IdleTimeout:       *idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	scheme := "http"
	if *tlsCert != "" {
		scheme = "https"
	}
	logger.Info("listening", "addr", ln.Addr().String(), "scheme", scheme)
	if *tlsCert != "" {
		logger.Info("tls certificate", "file", *tlsCert, "new", certMade,
			"names", slices.Concat(cert.Leaf.DNSNames, ipStrings(cert.Leaf.IPAddresses)),
			"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339), "sha256", fingerprint(cert.Leaf.Raw))
	}

	sweeping := make(chan struct{})
	go func() {
		defer close(sweeping)
		sweep(ctx, h, *sweepEvery)
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		logger.Error("server failed", "err", err)
		return 1
	case <-ctx.Done():
	}
	stop() // a second signal ends the program at once
	logger.Info("shutting down", "drain", *shutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), *shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Requests still in flight (a slow client, a delay fault, a commit
		// waiting on a lock) are cut off: the program was asked to stop,
		// and stops. Their database work is cancelled, and nothing they
		// did commits from here on.
		logger.Warn("drain time over; closing the remaining connections", "err", err)
		abort()
		_ = srv.Close()
	}
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
