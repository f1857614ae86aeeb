// Command idembench measures what idem costs. It sends a plain net/http
// POST, the same through go-retryablehttp, and idem with the memory and
// the file store. All run side by side against one fake payment server on
// loopback. It also measures the fake server's idempotency layer beside
// its bare handler, a same-key storm, and the file store's saves and
// open+list.
//
// It prints tables. Its last line is the p50 ratio of idem with the memory
// store to plain net/http:
//
//	ratio idem(memory)/net-http: 1.08
//
// Usage:
//
//	go run ./cmd/idembench [-quick] [-n 2000] [-concurrency 1] [-intents 10000,100000]
//
// With -postgres it also measures the middleware over pgstore, beside the
// same handler mounted bare. -postgres takes a DSN, or "start" for a
// throwaway server with fsync on. "start-nofsync" starts one whose commits
// do not wait for the disk. -server-only prints only the PostgreSQL
// variants. docs/BENCHMARKS.md tells what each run measures:
//
//	go run ./cmd/idembench -postgres start [-quick] [-n 3000]
//	go run ./cmd/idembench -postgres start -server-only -concurrency 16 -n 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/idemkit/idem/cmd/idembench/internal/bench"
	"github.com/idemkit/idem/internal/pgtest"
)

func main() {
	quick := flag.Bool("quick", false, "a short run (under 20s) with fewer requests and only the smallest store")
	n := flag.Int("n", 0, "requests per client variant (default 2000, 300 with -quick)")
	conc := flag.Int("concurrency", 1, "goroutines sending at once")
	intents := flag.String("intents", "", "comma-separated store sizes for open+list (default 10000,100000; 10000 with -quick)")
	dir := flag.String("dir", "", "directory for the file stores (default the system's temporary directory)")
	postgres := flag.String("postgres", "", `measure the server side on this PostgreSQL DSN; "start" starts a throwaway server, "start-nofsync" one that does not flush commits`)
	serverOnly := flag.Bool("server-only", false, "with -postgres, only the PostgreSQL figures: no storm, no client run")
	flag.Parse()

	if *postgres != "" {
		var concs []int
		flag.Visit(func(f *flag.Flag) {
			if f.Name == "concurrency" {
				concs = []int{max(1, *conc)}
			}
		})
		os.Exit(runPostgres(*postgres, *quick, *n, concs, *serverOnly))
	}

	cfg := bench.Defaults()
	if *quick {
		cfg = bench.Quick()
	}
	if *n > 0 {
		cfg.Requests = *n
	}
	cfg.Concurrency = max(1, *conc)
	cfg.Dir = *dir
	if *intents != "" {
		cfg.Intents = nil
		for _, f := range strings.Split(*intents, ",") {
			v, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || v < 1 {
				fmt.Fprintf(os.Stderr, "idembench: -intents: %q is not a positive number\n", f)
				os.Exit(2)
			}
			cfg.Intents = append(cfg.Intents, v)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.Run(ctx, cfg, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
}

// runPostgres is the -postgres run. It returns the exit code.
func runPostgres(dsn string, quick bool, n int, concs []int, serverOnly bool) int {
	cfg := bench.PGDefaults()
	if quick {
		cfg = bench.PGQuick()
	}
	if n > 0 {
		cfg.Requests = n
	}
	if concs != nil {
		cfg.Concurrencies = concs
	}
	cfg.NoStorm = serverOnly
	if dsn == "start" || dsn == "start-nofsync" {
		srv, err := pgtest.Start(pgtest.Options{Durable: dsn == "start"})
		if err != nil {
			fmt.Fprintln(os.Stderr, "idembench:", err)
			return 1
		}
		defer srv.Stop()
		dsn = srv.DSN("postgres")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.RunPostgres(ctx, dsn, cfg, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		return 1
	}
	if serverOnly {
		rep.Print(os.Stdout)
		return 0
	}
	// Then the client side, so that one run prints every figure. The
	// client's ratio comes last.
	ccfg := bench.Defaults()
	if quick {
		ccfg = bench.Quick()
	}
	crep, err := bench.Run(ctx, ccfg, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		return 1
	}
	crep.Print(os.Stdout)
	fmt.Println()
	rep.Print(os.Stdout)
	fmt.Printf("ratio idem(memory)/net-http: %.2f\n", crep.IdemRatio())
	return 0
}
