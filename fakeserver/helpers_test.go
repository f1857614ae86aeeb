package fakeserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/pgfake"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/pgtest"
)

const (
	payBody     = `{"amount":1500,"currency":"AZN","customer":"cus_1","description":"coffee"}`
	otherBody   = `{"amount":2500,"currency":"AZN","customer":"cus_1","description":"tea"}`
	declineBody = `{"amount":1500,"currency":"AZN","customer":"cus_declined"}`
)

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// answer is a response read in full.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// problem decodes an RFC 9457 body.
func (a answer) problem(tb testing.TB) idempotency.Problem {
	tb.Helper()
	require.Equal(tb, "application/problem+json", a.Header.Get("Content-Type"), "body: %s", a.Body)
	var p idempotency.Problem
	require.NoError(tb, json.Unmarshal(a.Body, &p))
	require.Equal(tb, a.Status, p.Status)
	return p
}

// req describes one request.
type req struct {
	Method, Path, Key, Auth, Body string
	NoKey                         bool
}

// send sends r with c and reads the answer; a transport error fails tb.
func send(tb testing.TB, c *http.Client, base string, r req) answer {
	tb.Helper()
	a, err := trySend(c, base, r)
	require.NoError(tb, err)
	return a
}

func trySend(c *http.Client, base string, r req) (answer, error) {
	if r.Method == "" {
		r.Method = http.MethodPost
	}
	if r.Path == "" {
		r.Path = "/payments"
	}
	hr, err := http.NewRequest(r.Method, base+r.Path, strings.NewReader(r.Body))
	if err != nil {
		return answer{}, err
	}
	if !r.NoKey {
		hr.Header.Set("Idempotency-Key", r.Key)
	}
	if r.Auth != "" {
		hr.Header.Set("Authorization", r.Auth)
	}
	resp, err := c.Do(hr)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: body}, err
}

// pay posts payBody under key.
func pay(tb testing.TB, s *fakeserver.Server, key, body string) answer {
	tb.Helper()
	return send(tb, s.Client(), s.URL, req{Key: key, Body: body})
}

// freshClient opens a new connection per request, so that a connection the
// server closes is seen as an error rather than retried by the Transport.
func freshClient(tb testing.TB) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// newServer starts a server with a manual clock.
func newServer(tb testing.TB, opts *fakeserver.Options) (*fakeserver.Server, *clock.Manual) {
	tb.Helper()
	clk := clock.NewManual(epoch)
	if opts == nil {
		opts = &fakeserver.Options{}
	}
	opts.Clock = clk
	// The Max* bounds are on memory and do not apply on PostgreSQL: the
	// tests of those bounds run in memory either way.
	bounded := opts.MaxRecords > 0 || opts.MaxPayments > 0 || opts.MaxOrders > 0
	if os.Getenv(envPostgres) == "1" && !bounded && opts.Storage == nil {
		opts.Storage = onPostgres(newPool(tb))
	}
	return start(tb, opts), clk
}

// skipOnPostgres skips a test of the in-memory caps when the state is in
// PostgreSQL, where MaxRecords, MaxPayments and MaxOrders do not apply:
// they bound the process's memory, and a database is bounded by its disk.
func skipOnPostgres(t *testing.T) {
	t.Helper()
	if os.Getenv(envPostgres) == "1" {
		t.Skip("the memory caps do not apply to state kept in PostgreSQL (see Options.Storage)")
	}
}

// envPostgres, set to 1, runs every test that starts its server with
// newServer on PostgreSQL, each on a database of its own, so that the
// contract is checked for both ways of keeping state.
const envPostgres = "IDEM_FAKESERVER_POSTGRES"

// newPool returns a pool on a new database with the fake server's schema.
func newPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.DSN(tb))
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	require.NoError(tb, pgfake.Migrate(context.Background(), pool))
	return pool
}

// onPostgres keeps a server's state in pool's database.
func onPostgres(pool *pgxpool.Pool) fakeserver.Storage {
	return pgfake.New(context.Background(), pool)
}

// start starts a server that is closed when tb and its subtests are done.
func start(tb testing.TB, opts *fakeserver.Options) *fakeserver.Server {
	tb.Helper()
	s := fakeserver.NewServer(opts)
	tb.Cleanup(s.Close)
	return s
}

// rtPost posts body to url with key and returns status, header and body, or
// the transport error.
func rtPost(c *http.Client, url, key, body string) (int, http.Header, string, error) {
	r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Authorization", "Bearer test_acme_1")
	resp, err := c.Do(r)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

// waitInProgress waits until s holds a record in progress: the first
// request is inside its delay.
func waitInProgress(t *testing.T, s *fakeserver.Server) {
	t.Helper()
	require.Eventually(t, func() bool { return s.Stats().InProgress == 1 }, 5*time.Second, 10*time.Millisecond)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
