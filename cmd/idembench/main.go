// Command idembench measures what idem costs: a plain net/http POST, the
// same through go-retryablehttp, idem with the memory store and idem with
// the file store, side by side against one fake payment server on
// loopback; the fake server's idempotency layer beside its bare handler;
// a same-key storm; and the file store's durable saves and open+list.
//
// It prints tables, then, as its last line, the p50 ratio of idem with the
// memory store to plain net/http:
//
//	ratio idem(memory)/net-http: 1.08
//
// Usage:
//
//	go run ./cmd/idembench [-quick] [-n 2000] [-concurrency 1] [-intents 10000,100000]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/idemkit/idem/internal/bench"
)

func main() {
	quick := flag.Bool("quick", false, "a short run (under 20s) with fewer requests and only the smallest store")
	n := flag.Int("n", 0, "requests per client variant (default 2000, 300 with -quick)")
	conc := flag.Int("concurrency", 1, "goroutines sending at once")
	intents := flag.String("intents", "", "comma-separated store sizes for open+list (default 10000,100000; 10000 with -quick)")
	dir := flag.String("dir", "", "directory for the file stores (default the system's temporary directory)")
	flag.Parse()

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
