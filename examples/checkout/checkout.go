package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// crashExitCode is the exit status of a run stopped by -crash.
const crashExitCode = 3

// config is the command line.
type config struct {
	state    string // state directory; "" means the default
	server   string // base URL; "" means the fake server in process
	order    string
	amount   int
	currency string
	customer string
	crash    bool
}

// usageError is a bad command line: exit status 2, as flag does.
type usageError struct{ error }

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("checkout", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.server, "server", "", "base `URL` of the payment API (POST /payments); empty starts the fake server in process")
	fs.StringVar(&cfg.state, "state", "", "`dir`ectory the intents are saved in (default: a temporary one with the in-process server, else "+defaultStateDir()+")")
	fs.StringVar(&cfg.order, "order", "order-1", "order `id`: one intent per order, named checkout:ID")
	fs.IntVar(&cfg.amount, "amount", 1500, "amount in minor units")
	fs.StringVar(&cfg.currency, "currency", "AZN", "three-letter currency code")
	fs.StringVar(&cfg.customer, "customer", "cus_1", "customer id (cus_declined is declined by the fake server)")
	fs.BoolVar(&cfg.crash, "crash", false, "exit with status 3 right after the first attempt is sent, before its answer is handled (needs -server)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: checkout [flags]\n\nPays for an order through idem and prints what happened.\n"+
			"The environment variable CHECKOUT_TOKEN, if set, is sent as a bearer token.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	case cfg.crash && cfg.server == "":
		return cfg, usageError{errors.New("-crash needs -server: the in-process fake server dies with the process, so nothing could resume; without -server the demonstration simulates the crash itself")}
	case cfg.amount <= 0:
		return cfg, usageError{errors.New("-amount must be greater than 0")}
	}
	if cfg.server != "" {
		u, err := url.Parse(cfg.server)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cfg, usageError{fmt.Errorf("-server %q is not an http(s) URL", cfg.server)}
		}
		cfg.server = strings.TrimSuffix(cfg.server, "/")
	}
	return cfg, nil
}

// defaultStateDir is where intents are kept between runs against a server:
// the user's configuration directory, not the cache directory, which the
// system or the user may clear while a payment is unresolved.
func defaultStateDir() string {
	if dir, err := os.UserConfigDir(); err == nil {
		return filepath.Join(dir, "idem-checkout")
	}
	return ".idem-state"
}

// run is the whole program; main only maps its error to an exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.server == "" {
		return runEmbedded(ctx, cfg, stdout)
	}
	state := cfg.state
	if state == "" {
		state = defaultStateDir()
	}
	s := newSession(ctx, stdout, cfg.server, state)
	kind := "no /_fake/stats: no faults are injected, no counts printed"
	if s.admin != nil {
		kind = "a fake server: faults are injected and its counts printed"
	}
	fmt.Fprintf(stdout, "server: %s (%s)\nstate:  %s\n\n", cfg.server, kind, state)
	var crash func()
	if cfg.crash {
		crash = func() {
			fmt.Fprintf(stdout, "  crash: the process exits now (status %d), before the answer is handled\n", crashExitCode)
			fmt.Fprintln(stdout, "  run the same command again to resume the intent with the same key")
			os.Exit(crashExitCode)
		}
	}
	if err := s.pay(ctx, cfg, cfg.order, crash); err != nil {
		return err
	}
	s.printStats(ctx)
	return nil
}

// runEmbedded demonstrates everything in one process against the fake
// server: a lost response, then a crash and a restart on the same state.
func runEmbedded(ctx context.Context, cfg config, stdout io.Writer) error {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()

	state, note := cfg.state, ""
	if state == "" {
		// The in-process server's payments die with the process, so
		// intents kept for the next run would point at a server that is
		// gone. A temporary directory holds this run's intents.
		dir, err := os.MkdirTemp("", "idem-checkout-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		state, note = dir, " (temporary; -state DIR keeps it)"
	}
	fmt.Fprintf(stdout, "server: fake server in process at %s (-server URL pays elsewhere)\nstate:  %s%s\n", srv.URL, state, note)

	s := newSession(ctx, stdout, srv.URL, state)

	fmt.Fprintf(stdout, "\n1. A lost response: the retry carries the same key\n")
	if err := s.pay(ctx, cfg, cfg.order, nil); err != nil {
		return err
	}
	s.printStats(ctx)

	second := cfg.order + "-b"
	fmt.Fprintf(stdout, "\n2. A crash between send and answer, then a restart\n")
	crashCtx, crash := context.WithCancel(ctx)
	err := s.pay(crashCtx, cfg, second, crash)
	crash()
	if err != nil && ctx.Err() == nil && errors.Is(err, idem.ErrOutcomeUnknown) {
		fmt.Fprintf(stdout, "  crash: the app stops here (simulated); the intent stays in the state directory\n")
	} else if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  restart: a new client opens the same state directory\n")
	if err := s.pay(ctx, cfg, second, nil); err != nil {
		return err
	}
	st := s.printStats(ctx)
	if st != nil {
		fmt.Fprintf(stdout, "\n2 orders, %d provider charges: each order was paid once.\n", st.ProviderCharges)
	}
	return nil
}

// session is what the runs of the command share: the server and the state
// directory. Each call of pay is one run of the app: it opens the state
// directory, resumes what an earlier run left unresolved and pays.
type session struct {
	out     io.Writer
	baseURL string
	state   string
	token   string
	// admin talks to the fake server's /_fake/ endpoints on connections of
	// its own; nil when the server has none.
	admin *http.Client
}

func newSession(ctx context.Context, out io.Writer, baseURL, state string) *session {
	s := &session{out: out, baseURL: baseURL, state: state, token: os.Getenv("CHECKOUT_TOKEN"),
		admin: &http.Client{Timeout: 10 * time.Second}}
	if _, err := s.stats(ctx); err != nil {
		s.admin = nil
	}
	return s
}

// pay is one run of the app, paying for the order id. crash, if not nil, is
// called right after the first attempt of the new payment, before its
// answer is handled.
func (s *session) pay(ctx context.Context, cfg config, id string, crash func()) error {
	store, err := persist.OpenDir(s.state, nil)
	if errors.Is(err, persist.ErrLocked) {
		return fmt.Errorf("another checkout is using %s: %w", s.state, err)
	}
	if err != nil {
		return err
	}
	defer store.Close()

	// A transport of its own, as a new process would have: no connection
	// is shared with an earlier run.
	hc := &http.Client{Transport: &bearer{token: s.token, base: http.DefaultTransport.(*http.Transport).Clone()},
		Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()

	var (
		armed func()
		mu    sync.Mutex // SettleAll makes attempts from several goroutines
	)
	client, err := idem.New(idem.Config{
		Store:      store,
		HTTPClient: hc,
		Server:     idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
		OnAttempt: func(a idem.Attempt) {
			mu.Lock()
			defer mu.Unlock()
			s.printAttempt(a, armed != nil)
			if f := armed; f != nil {
				armed = nil
				f()
			}
		},
	})
	if err != nil {
		return err
	}

	// First, what an earlier run left unresolved, each with its own key.
	settled, err := client.SettleAll(ctx)
	for _, st := range settled {
		fmt.Fprintf(s.out, "  unresolved intent %s from an earlier run: key %s, now %s\n", st.Intent.Name(), st.Intent.Key(), st.Intent.State())
		if err := s.printOutcome(st.Response, st.Err); err != nil {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("reading the unresolved intents in %s: %w", s.state, err)
	}

	req, err := idem.JSONRequest(http.MethodPost, s.baseURL+"/payments", map[string]any{
		"amount": cfg.amount, "currency": cfg.currency, "customer": cfg.customer, "description": "order " + id})
	if err != nil {
		return err
	}
	// Intent is only here to show the key and aim the fault at it; Send
	// alone does the payment.
	name := "checkout:" + id
	in, err := client.Intent(ctx, name, req)
	if err != nil {
		return s.printOutcome(nil, err)
	}
	if in.State().Resolved() {
		fmt.Fprintf(s.out, "  intent %s: already %s (key %s); nothing is sent\n", name, in.State(), in.Key())
	} else {
		fmt.Fprintf(s.out, "  intent %s: key %s, saved before sending\n", name, in.Key())
		fmt.Fprintf(s.out, "  POST /payments {amount %d, currency %s, customer %s}\n", cfg.amount, cfg.currency, cfg.customer)
		if s.admin != nil {
			if err := s.injectDrop(ctx, in.Key()); err != nil {
				return err
			}
			fmt.Fprintf(s.out, "  fault: the server will do the work and commit, then drop its answer\n")
		}
	}
	armed = crash
	resp, err := client.Send(ctx, name, req)
	armed = nil
	return s.printOutcome(resp, err)
}

func (s *session) printAttempt(a idem.Attempt, crashing bool) {
	var what string
	switch {
	case a.Err != nil:
		what = "no answer (" + rootCause(a.Err) + ")"
	default:
		what = fmt.Sprintf("%d %s", a.StatusCode, http.StatusText(a.StatusCode))
	}
	if a.Retry && !crashing {
		what += "; retrying with the same key and bytes"
	}
	fmt.Fprintf(s.out, "  attempt %d: %s\n", a.Number, what)
}

// printOutcome says how a payment ended. A final answer, a declined card
// included, is not an error of the program; an unknown outcome is.
func (s *session) printOutcome(resp *idem.Response, err error) error {
	var apiErr *idem.APIError
	var unresolved *idem.UnresolvedError
	switch {
	case errors.As(err, &unresolved):
		return fmt.Errorf("the order changed while its earlier payment (key %s) has an unknown outcome; see examples/cart: %w",
			unresolved.Previous.Key(), err)
	case err == nil:
		var p struct{ ID, Status string }
		_ = json.Unmarshal(resp.Body, &p)
		how := ""
		switch {
		case resp.FromStore:
			how = " (the answer stored on this device)"
		case resp.Replayed:
			how = " (replayed: an earlier attempt made the charge and its answer was lost)"
		}
		fmt.Fprintf(s.out, "  paid: %d, payment %s %s%s\n", resp.StatusCode, p.ID, p.Status, how)
		return nil
	case errors.As(err, &apiErr):
		fmt.Fprintf(s.out, "  final answer: %d %s; stored, never retried\n", apiErr.StatusCode, apiErr.Problem.Type)
		return nil
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return fmt.Errorf("outcome unknown; the intent is kept: run the same command again to resume it: %w", err)
	default:
		return err
	}
}

// stats reads the fake server's counters.
func (s *session) stats(ctx context.Context) (*fakeserver.Stats, error) {
	var st fakeserver.Stats
	return &st, s.callAdmin(ctx, http.MethodGet, "stats", nil, &st)
}

// printStats prints the fake server's counts, if it is one.
func (s *session) printStats(ctx context.Context) *fakeserver.Stats {
	st, err := s.stats(ctx)
	if err != nil {
		return nil
	}
	fmt.Fprintf(s.out, "  server: %d payments, %d provider charges, %d requests\n", st.Payments, st.ProviderCharges, st.Requests)
	return st
}

// injectDrop asks the fake server to lose its next answer for key.
func (s *session) injectDrop(ctx context.Context, key string) error {
	return s.callAdmin(ctx, http.MethodPost, "faults", map[string]any{"fault": fakeserver.FaultDropResponse, "key": key}, nil)
}

// callAdmin calls one of the fake server's /_fake/ endpoints with in as its
// JSON body, if not nil, and decodes its JSON answer into out, if not nil.
func (s *session) callAdmin(ctx context.Context, method, path string, in, out any) error {
	if s.admin == nil {
		return errors.New("no admin endpoints")
	}
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.baseURL+"/_fake/"+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.admin.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", method, req.URL.Path, resp.Status, bytes.TrimSpace(msg))
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// rootCause is the innermost error, without the URL the client wraps it in.
func rootCause(err error) string {
	var u *url.Error
	if errors.As(err, &u) {
		err = u.Err
	}
	return err.Error()
}

// bearer adds the credentials in the transport, so they are never part of
// an intent's stored request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.token == "" {
		return b.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach base.
func (b *bearer) CloseIdleConnections() {
	if c, ok := b.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
