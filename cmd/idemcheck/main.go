// Command idemcheck certifies a server against the Idempotency-Key contract
// (docs/CONTRACT.md), from its URL: it sends requests it builds itself
// (plain net/http, not idem's client) and prints one line per rule, PASS,
// FAIL or SKIP, with what a FAIL costs a client and the requests and
// answers that show it.
//
//	go run github.com/idemkit/idem/cmd/idemcheck@latest \
//	    -url https://staging.example/payments \
//	    -body '{"amount": 100, "currency": "AZN", "customer": "cus_1"}' \
//	    -auth "Bearer $TOKEN_A" -auth2 "Bearer $TOKEN_B" \
//	    -lookup 'https://staging.example/payments?idempotency_key={key}'
//
// Every request carries a fresh random key, so nothing collides with real
// traffic; each one that succeeds creates a real record, and idemcheck says
// how many requests it will send before it sends the first. -auth and
// -auth2 (or $IDEMCHECK_AUTH and $IDEMCHECK_AUTH2) are two callers'
// Authorization values: without -auth2 the scoping row is SKIP, without
// -lookup the lookup row. The fault rows (5xx-not-stored, dead-worker) need
// a fault hook that makes the server fail on purpose: the fake server's
// admin endpoints, looked for at the URL's origin, or a real server's hook
// at -admin (docs/IDEMCHECK.md, "The fault hook"); they are SKIP without
// one.
//
// Exit status 0 when no row failed, 1 when one did, 2 when the check could
// not run (bad flags, or the server refused -body); -json prints the report
// as one JSON object. Run it with -h for every flag and row. The manual,
// with a real run, every row and what a FAIL costs a client, is
// docs/IDEMCHECK.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/idemkit/idem/cmd/idemcheck/internal/contractcheck"
)

const usage = `Usage: idemcheck -url URL [flags]

Checks that the endpoint at URL, which requires an Idempotency-Key, keeps
the Idempotency-Key contract, by sending it requests built here: every one
with a fresh random key and the body given (-body), so each creates at most
one real record. Before sending, it says how many requests it will send at
most. It never loops without bound: the only wait, for a dead worker's
lease, ends at -lease-wait.

Output: one line per row, PASS, FAIL or SKIP; under a FAIL, what it costs
a client, the requests sent (->) and what came back (<-); then a summary. -json prints the report
as one JSON object instead. Exit status: 0 when no row failed, 1 when one
did, 2 when the check could not run (bad flags, the body refused).

Rows that need a second caller (-auth2) or a lookup endpoint (-lookup) are
SKIP without them. The fault rows (5xx-not-stored, dead-worker) run when
the server offers a fault hook: the fake server's admin endpoints (GET
/_fake/stats, POST /_fake/faults at the URL's origin), or a hook of the
server's own at -admin that speaks their protocol (docs/IDEMCHECK.md, "The
fault hook"); they are SKIP otherwise, with the reason.

Rows:
`

const maxFileBytes = 1 << 20

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the program; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg contractcheck.Config
	var body, changed, invalid string
	fs.StringVar(&cfg.URL, "url", "", "the endpoint to check, such as https://staging.example/payments (required)")
	fs.StringVar(&cfg.Method, "method", contractcheck.DefaultMethod, "POST or PATCH")
	fs.StringVar(&body, "body", contractcheck.DefaultBody, "a request body the server accepts with a 2xx; @FILE reads a file")
	fs.StringVar(&cfg.ContentType, "content-type", contractcheck.DefaultContentType, "the requests' Content-Type")
	fs.StringVar(&changed, "changed-body", "", "a valid body other than -body, for changed-body; @FILE reads a file\n(default: derived from a JSON -body: its first integer plus one)")
	fs.StringVar(&invalid, "invalid-body", "", "a body the server refuses before any work, for validation-key-free;\n@FILE reads a file (default: a JSON -body cut short)")
	fs.StringVar(&cfg.Auth, "auth", os.Getenv("IDEMCHECK_AUTH"), "the Authorization header of the first caller (default $IDEMCHECK_AUTH; none: anonymous)")
	fs.StringVar(&cfg.Auth2, "auth2", os.Getenv("IDEMCHECK_AUTH2"), "the Authorization header of a second caller, for scoping (default $IDEMCHECK_AUTH2)")
	fs.StringVar(&cfg.Lookup, "lookup", "", "the lookup by key, {key} where the key goes, such as\nhttps://staging.example/payments?idempotency_key={key}")
	fs.StringVar(&cfg.Admin, "admin", "", `the base URL of the server's fault hook (GET stats, POST faults), or "off"
(default: the URL's origin plus /_fake/, the fake server's, used when it answers)`)
	fs.StringVar(&cfg.ProblemBase, "problem-base", contractcheck.DefaultProblemBase, "the prefix of the server's problem types")
	fs.IntVar(&cfg.Concurrency, "concurrency", contractcheck.DefaultConcurrency, fmt.Sprintf("duplicates sent at once by the concurrent row, 2 to %d", contractcheck.MaxConcurrency))
	fs.DurationVar(&cfg.LeaseWait, "lease-wait", contractcheck.DefaultLeaseWait, "the longest wait for a dead worker's lease to end")
	fs.DurationVar(&cfg.Timeout, "timeout", contractcheck.DefaultTimeout, "the longest wait for each answer")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprint(out, usage)
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, r := range contractcheck.Rows() {
			fmt.Fprintf(tw, "  %s\t%s\n", r.ID, r.Title)
		}
		_ = tw.Flush()
		fmt.Fprint(out, "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "idemcheck: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q; flags only (-h lists them)", fs.Arg(0))
	}
	if cfg.URL == "" {
		return bad("-url is required: the endpoint that requires an Idempotency-Key (-h for help)")
	}
	var err error
	if cfg.Body, err = readArg("-body", body); err != nil {
		return bad("%v", err)
	}
	if changed != "" {
		if cfg.ChangedBody, err = readArg("-changed-body", changed); err != nil {
			return bad("%v", err)
		}
	}
	if invalid != "" {
		if cfg.InvalidBody, err = readArg("-invalid-body", invalid); err != nil {
			return bad("%v", err)
		}
	}

	requests, records, err := contractcheck.Plan(cfg)
	if err != nil {
		return bad("%v", strings.TrimPrefix(err.Error(), "contractcheck: "))
	}
	// The plan goes where a person reads it before anything is sent.
	planOut := stdout
	if *asJSON {
		planOut = stderr
	}
	fmt.Fprintf(planOut, "idemcheck: checking %s %s against the Idempotency-Key contract\n", strings.ToUpper(cfg.Method), cfg.URL)
	fmt.Fprintf(planOut, "idemcheck: sending at most %d requests, all keys fresh and random, creating up to %d records\n", requests, records)

	var progress func(contractcheck.Row)
	if !*asJSON {
		progress = func(r contractcheck.Row) { printRow(stdout, r) }
	}
	rep, err := contractcheck.Run(ctx, cfg, progress)
	if err != nil {
		return bad("%v", strings.TrimPrefix(err.Error(), "contractcheck: "))
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return bad("writing the report: %v", err)
		}
	} else {
		fmt.Fprintf(stdout, "%d rows: %d PASS, %d FAIL, %d SKIP; %d requests sent\n",
			len(rep.Rows), rep.Pass, rep.Fail, rep.Skip, rep.Sent)
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

// printRow prints one row, and the evidence under a FAIL.
func printRow(w io.Writer, r contractcheck.Row) {
	fmt.Fprintf(w, "%s %-20s %s\n", r.Status, r.ID, r.Detail)
	if r.Cost != "" {
		fmt.Fprintf(w, "     costs a client: %s\n", r.Cost)
	}
	for _, e := range r.Evidence {
		fmt.Fprintf(w, "     -> %s\n     <- %s\n", e.Request, e.Response)
	}
}

// readArg returns v, or the content of the file v names after an @.
func readArg(flagName, v string) ([]byte, error) {
	name, ok := strings.CutPrefix(v, "@")
	if !ok {
		return []byte(v), nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("%s: %s is over 1 MiB", flagName, name)
	}
	return b, nil
}
