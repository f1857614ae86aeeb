// Package contractcheck judges a running HTTP server against the
// Idempotency-Key contract (docs/CONTRACT.md), from its URL
// alone: it sends requests it builds itself with net/http and compares the
// answers with the contract, one row per rule. It is the engine of
// cmd/idemcheck.
//
// Every request uses fresh random keys, so the check never collides with
// real traffic; it creates real records on the server (one per fresh key),
// and [Plan] says how many requests it will send before any is sent.
//
// Rows that need a way to make the server fail (a 5xx, a crashed worker)
// run only when the server offers a fault hook: the fake server's admin
// endpoints (/_fake/stats and /_fake/faults), or a hook of the server's
// own that speaks their protocol (docs/IDEMCHECK.md, "The fault hook");
// otherwise they are SKIP with the reason.
package contractcheck

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Status is the verdict on one row.
type Status string

// The verdicts.
const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Skip Status = "SKIP"
)

// Defaults for a zero [Config].
const (
	DefaultMethod      = http.MethodPost
	DefaultContentType = "application/json"
	DefaultProblemBase = "https://idem.dev/problems/"
	DefaultConcurrency = 5
	DefaultLeaseWait   = 2 * time.Minute
	// MaxLeaseWait bounds Config.LeaseWait.
	MaxLeaseWait   = time.Hour
	DefaultTimeout = 30 * time.Second
	// DefaultBody is a payment the fake server accepts.
	DefaultBody = `{"amount":1500,"currency":"AZN","customer":"cus_1","description":"idemcheck"}`
	// MaxConcurrency bounds Config.Concurrency.
	MaxConcurrency = 50
	// concurrentDelay is how long the delay fault holds the work of the
	// concurrent row, so that its duplicates find the key in progress.
	concurrentDelay = 500 * time.Millisecond
	// maxResponseBytes bounds how much of each answer is read.
	maxResponseBytes = 1 << 20
)

// Config says what to check. Only URL is required; a zero field means its
// default.
type Config struct {
	// URL is the endpoint that requires an Idempotency-Key, such as
	// https://staging.example/payments.
	URL string
	// Method is POST when empty; PATCH is the other method the contract
	// covers.
	Method string
	// Body is a request body the server accepts (a 2xx answer); empty means
	// [DefaultBody].
	Body []byte
	// ContentType is the request's Content-Type; empty means
	// application/json.
	ContentType string
	// ChangedBody is a valid body that differs from Body, for the
	// changed-body row. Nil means derived from a JSON Body (its first integer
	// field plus one, or its first string field changed).
	ChangedBody []byte
	// InvalidBody is a body the server refuses before doing any work, for
	// the validation row. Nil means derived from a JSON Body (cut short,
	// which is malformed JSON).
	InvalidBody []byte
	// Auth is the Authorization header of the first caller; empty sends
	// none (the anonymous caller).
	Auth string
	// Auth2 is the Authorization header of a second caller, for the scoping
	// row; empty skips it.
	Auth2 string
	// Lookup is the URL of the lookup by key with {key} where the key goes,
	// such as https://staging.example/payments?idempotency_key={key}; empty
	// skips the lookup row.
	Lookup string
	// Admin is the base URL of the server's fault hook (the fake server's
	// admin endpoints, or a hook that speaks their protocol), under which
	// GET stats and POST faults are served. Empty means the URL's origin
	// plus /_fake/, the fake server's; "off" never uses one.
	Admin string
	// ProblemBase prefixes the problem types the server answers; empty means
	// [DefaultProblemBase].
	ProblemBase string
	// Concurrency is how many duplicates the concurrent row sends at once,
	// 2 to [MaxConcurrency]; zero means [DefaultConcurrency].
	Concurrency int
	// LeaseWait bounds how long the dead-worker row waits for a lease to
	// end, up to [MaxLeaseWait]; zero means [DefaultLeaseWait].
	LeaseWait time.Duration
	// Timeout bounds each request; zero means [DefaultTimeout].
	Timeout time.Duration
	// Transport sends the requests; nil means a transport that opens a new
	// connection for every request, so that net/http never resends one by
	// itself.
	Transport http.RoundTripper
	// Sleep waits d or until ctx is done; nil means a real timer. Tests
	// make it advance the server's manual clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// NewKey returns a fresh key; nil means a random UUID.
	NewKey func() string
}

// Exchange is one request and what came back, as text for a report.
type Exchange struct {
	Request  string `json:"request"`
	Response string `json:"response"`
}

// Row is the verdict on one rule of the contract.
type Row struct {
	ID     string `json:"id"`
	Title  string `json:"title"`
	Status Status `json:"status"`
	// Detail says what was seen: the reason for a SKIP, what was wrong for
	// a FAIL, what was checked for a PASS.
	Detail string `json:"detail"`
	// Cost says, for a FAIL, what breaking the rule costs a client.
	Cost string `json:"cost,omitempty"`
	// Evidence lists the exchanges behind a FAIL.
	Evidence []Exchange `json:"evidence,omitempty"`
}

// Report is the result of [Run].
type Report struct {
	URL string `json:"url"`
	// Planned is the most requests the check sends, Sent how many it did.
	Planned int   `json:"planned_requests"`
	Sent    int   `json:"sent_requests"`
	Rows    []Row `json:"rows"`
	Pass    int   `json:"pass"`
	Fail    int   `json:"fail"`
	Skip    int   `json:"skip"`
}

// OK reports whether no row failed.
func (r *Report) OK() bool { return r.Fail == 0 }

// ErrSetup is wrapped by the errors of [Run] and [Plan] that stop the check
// before any row is judged: a bad Config, or a Body the server does not
// accept with a 2xx.
var ErrSetup = errors.New("contractcheck: cannot check")

// config is Config with the defaults filled in and checked.
type config struct {
	Config
	url   *url.URL
	admin string // "" when not used
}

func (c Config) normalise() (*config, error) {
	bad := func(format string, a ...any) (*config, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrSetup}, a...)...)
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return bad("-url %q is not an http or https URL", c.URL)
	}
	if c.Method == "" {
		c.Method = DefaultMethod
	}
	c.Method = strings.ToUpper(c.Method)
	if c.Method != http.MethodPost && c.Method != http.MethodPatch {
		return bad("method %s: the contract covers POST and PATCH", c.Method)
	}
	if len(c.Body) == 0 {
		c.Body = []byte(DefaultBody)
	}
	if c.ContentType == "" {
		c.ContentType = DefaultContentType
	}
	if c.ProblemBase == "" {
		c.ProblemBase = DefaultProblemBase
	}
	switch {
	case c.Concurrency == 0:
		c.Concurrency = DefaultConcurrency
	case c.Concurrency < 2 || c.Concurrency > MaxConcurrency:
		return bad("concurrency %d: give 2 to %d", c.Concurrency, MaxConcurrency)
	}
	switch {
	case c.LeaseWait == 0:
		c.LeaseWait = DefaultLeaseWait
	case c.LeaseWait < 0 || c.LeaseWait > MaxLeaseWait:
		return bad("lease wait %v: give up to %v", c.LeaseWait, MaxLeaseWait)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Auth2 != "" && c.Auth2 == c.Auth {
		return bad("the two credentials are the same; give -auth2 another caller's Authorization")
	}
	if c.Lookup != "" {
		lu, err := url.Parse(strings.ReplaceAll(c.Lookup, "{key}", "k"))
		if err != nil || !strings.Contains(c.Lookup, "{key}") || (lu.Scheme != "http" && lu.Scheme != "https") {
			return bad("lookup %q must be an http or https URL with {key} where the key goes", c.Lookup)
		}
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	if c.NewKey == nil {
		c.NewKey = uuid.NewString
	}
	cfg := &config{Config: c, url: u}
	switch c.Admin {
	case "off":
	case "":
		cfg.admin = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/_fake/"}).String()
	default:
		au, err := url.Parse(c.Admin)
		if err != nil || (au.Scheme != "http" && au.Scheme != "https") || au.Host == "" {
			return bad("admin %q is not an http or https URL", c.Admin)
		}
		cfg.admin = strings.TrimSuffix(c.Admin, "/") + "/"
	}
	return cfg, nil
}

// Plan returns the most requests [Run] sends with cfg, and how many of them
// may create a record on the server.
func Plan(cfg Config) (requests, records int, err error) {
	c, err := cfg.normalise()
	if err != nil {
		return 0, 0, err
	}
	for _, r := range rows {
		n, rec := r.plan(c)
		requests += n
		records += rec
	}
	return requests, records, nil
}

// Run checks the server and returns the report; each row is also passed to
// progress (if not nil) as soon as it is judged. It fails, wrapping
// [ErrSetup], when cfg is wrong or the server does not accept cfg.Body with
// a fresh key, and with ctx's error when ctx ends first; a server that
// breaks the contract is a report with FAIL rows, not an error.
//
// Run never sends more requests than [Plan] returns: a request past the
// plan is not sent and fails its row. Calls of Run share nothing and may
// run at the same time.
func Run(ctx context.Context, cfg Config, progress func(Row)) (*Report, error) {
	c, err := cfg.normalise()
	if err != nil {
		return nil, err
	}
	planned, _, _ := Plan(cfg)
	ck := &checker{cfg: c, budget: int64(planned)}
	ck.client = &http.Client{
		Transport: c.Transport,
		Timeout:   c.Timeout,
		// A redirect is judged as it is, not followed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if ck.client.Transport == nil {
		ck.client.Transport = &http.Transport{Proxy: http.ProxyFromEnvironment, DisableKeepAlives: true,
			TLSHandshakeTimeout: 10 * time.Second}
	}
	rep := &Report{URL: c.URL, Planned: planned}
	for _, r := range rows {
		row := r.run(ck, ctx)
		if err := ctx.Err(); err != nil {
			// An interrupted request says nothing about the server.
			return nil, fmt.Errorf("contractcheck: interrupted after %d rows: %w", len(rep.Rows), err)
		}
		if row.Status == "" { // the baseline failed: nothing else can be judged
			return nil, fmt.Errorf("%w: %s", ErrSetup, row.Detail)
		}
		row.ID, row.Title = r.id, r.title
		if row.Status == Fail {
			row.Cost = r.cost
		}
		rep.Rows = append(rep.Rows, row)
		switch row.Status {
		case Pass:
			rep.Pass++
		case Fail:
			rep.Fail++
		case Skip:
			rep.Skip++
		}
		if progress != nil {
			progress(row)
		}
	}
	rep.Sent = int(ck.sent.Load())
	return rep, nil
}

// checker is the state of one Run.
type checker struct {
	cfg    *config
	client *http.Client
	budget int64
	sent   atomic.Int64

	baseline     *exchange   // the first fresh request and its answer
	fresh        []*exchange // first answers to fresh keys
	adminChecked bool
	adminUsable  bool
	adminReason  string // why the admin endpoints are not used

	// keyed holds every answer to a request that carried a key, which
	// the key-echo row judges.
	keyedMu sync.Mutex
	keyed   []*exchange
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
