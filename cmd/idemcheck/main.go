// Command idemcheck certifies a server against the Idempotency-Key
// contract (docs/CONTRACT.md), from its URL. It sends requests it builds
// itself, with plain net/http, not idem's client. It prints one line per
// rule: PASS, FAIL or SKIP. A FAIL says what it costs a client, and shows
// the requests and answers.
//
//	go run github.com/idemkit/idem/cmd/idemcheck@latest \
//	    -url https://staging.example/payments \
//	    -body '{"amount": 100, "currency": "AZN", "customer": "cus_1"}' \
//	    -auth "Bearer $TOKEN_A" -auth2 "Bearer $TOKEN_B" \
//	    -lookup 'https://staging.example/payments?idempotency_key={key}'
//
// Every request carries a fresh random key, so nothing collides with real
// traffic. Each one that succeeds creates a real record. So idemcheck says
// how many requests it will send before it sends the first. The fault rows
// need a fault hook that makes the server fail on purpose. Without one
// they are SKIP.
//
// The exit status is 0 when no row failed and 1 when one did. It is 2
// when the check could not run. -json prints the report as one JSON
// object. Run it with -h for every flag and row. docs/IDEMCHECK.md is the
// manual, with a real run and every row.
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
	o, code := parseFlags(args, stderr)
	if o == nil {
		return code
	}
	if err := o.readBodies(); err != nil {
		return bad(stderr, "%v", err)
	}
	requests, records, err := contractcheck.Plan(o.cfg)
	if err != nil {
		return bad(stderr, "%v", strings.TrimPrefix(err.Error(), "contractcheck: "))
	}
	// The plan goes where a person reads it before anything is sent.
	planOut := stdout
	if o.json {
		planOut = stderr
	}
	fmt.Fprintf(planOut, "idemcheck: checking %s %s against the Idempotency-Key contract\n", strings.ToUpper(o.cfg.Method), o.cfg.URL)
	fmt.Fprintf(planOut, "idemcheck: sending at most %d requests, all keys fresh and random, creating up to %d records\n", requests, records)

	var progress func(contractcheck.Row)
	if !o.json {
		progress = func(r contractcheck.Row) { printRow(stdout, r) }
	}
	rep, err := contractcheck.Run(ctx, o.cfg, progress)
	if err != nil {
		return bad(stderr, "%v", strings.TrimPrefix(err.Error(), "contractcheck: "))
	}
	if err := writeReport(stdout, rep, o.json); err != nil {
		return bad(stderr, "writing the report: %v", err)
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

// options are the program's flags.
type options struct {
	cfg contractcheck.Config
	// body, changed and invalid are the body flags as given: a body, or
	// @FILE. readBodies puts them in cfg.
	body, changed, invalid string
	// json prints the report as JSON.
	json bool
}

// parseFlags reads the flags. A nil options means the program ends now,
// with the exit status: 0 after -h, 2 for bad flags. It explains bad flags
// on stderr.
func parseFlags(args []string, stderr io.Writer) (*options, int) {
	o := &options{}
	cfg := &o.cfg
	fs := flag.NewFlagSet("idemcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.URL, "url", "", "the endpoint to check, such as https://staging.example/payments (required)")
	fs.StringVar(&cfg.Method, "method", contractcheck.DefaultMethod, "POST or PATCH")
	fs.StringVar(&o.body, "body", contractcheck.DefaultBody, "a request body the server accepts with a 2xx; @FILE reads a file")
	fs.StringVar(&cfg.ContentType, "content-type", contractcheck.DefaultContentType, "the requests' Content-Type")
	fs.StringVar(&o.changed, "changed-body", "", "a valid body other than -body, for changed-body; @FILE reads a file\n(default: derived from a JSON -body: its first integer plus one)")
	fs.StringVar(&o.invalid, "invalid-body", "", "a body the server refuses before any work, for validation-key-free;\n@FILE reads a file (default: a JSON -body cut short)")
	fs.StringVar(&cfg.Auth, "auth", os.Getenv("IDEMCHECK_AUTH"), "the Authorization header of the first caller (default $IDEMCHECK_AUTH; none: anonymous)")
	fs.StringVar(&cfg.Auth2, "auth2", os.Getenv("IDEMCHECK_AUTH2"), "the Authorization header of a second caller, for scoping (default $IDEMCHECK_AUTH2)")
	fs.StringVar(&cfg.Lookup, "lookup", "", "the lookup by key, {key} where the key goes, such as\nhttps://staging.example/payments?idempotency_key={key}")
	fs.StringVar(&cfg.Admin, "admin", "", `the base URL of the server's fault hook (GET stats, POST faults), or "off"
(default: the URL's origin plus /_fake/, the fake server's, used when it answers)`)
	fs.StringVar(&cfg.ProblemBase, "problem-base", contractcheck.DefaultProblemBase, "the prefix of the server's problem types")
	fs.IntVar(&cfg.Concurrency, "concurrency", contractcheck.DefaultConcurrency, fmt.Sprintf("duplicates sent at once by the concurrent row, 2 to %d", contractcheck.MaxConcurrency))
	fs.DurationVar(&cfg.LeaseWait, "lease-wait", contractcheck.DefaultLeaseWait, "the longest wait for a dead worker's lease to end")
	fs.DurationVar(&cfg.Timeout, "timeout", contractcheck.DefaultTimeout, "the longest wait for each answer")
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	fs.Usage = func() { printUsage(fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	if fs.NArg() > 0 {
		return nil, bad(stderr, "unexpected argument %q; flags only (-h lists them)", fs.Arg(0))
	}
	if cfg.URL == "" {
		return nil, bad(stderr, "-url is required: the endpoint that requires an Idempotency-Key (-h for help)")
	}
	return o, 0
}

// printUsage prints the help: what the program does, its rows and its
// flags.
func printUsage(fs *flag.FlagSet) {
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

// readBodies puts the body flags in the config, reading the files they
// name. An empty -changed-body or -invalid-body leaves the check's
// default.
func (o *options) readBodies() error {
	var err error
	if o.cfg.Body, err = readArg("-body", o.body); err != nil {
		return err
	}
	if o.changed != "" {
		if o.cfg.ChangedBody, err = readArg("-changed-body", o.changed); err != nil {
			return err
		}
	}
	if o.invalid != "" {
		if o.cfg.InvalidBody, err = readArg("-invalid-body", o.invalid); err != nil {
			return err
		}
	}
	return nil
}

// writeReport prints the report's summary line, or the report as JSON.
// In text the rows were printed as they came.
func writeReport(w io.Writer, rep *contractcheck.Report, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(w, "%d rows: %d PASS, %d FAIL, %d SKIP; %d requests sent\n",
		len(rep.Rows), rep.Pass, rep.Fail, rep.Skip, rep.Sent)
	return nil
}

// bad explains on stderr why the check cannot run. It returns its exit
// status, 2.
func bad(stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, "idemcheck: "+format+"\n", a...)
	return 2
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
