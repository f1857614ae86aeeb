package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/examples/server/faulthook"
	"github.com/idemkit/idem/idempotency/pgstore"
	"github.com/idemkit/idem/internal/doccheck"
	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The tokens of the tests: alice has two (one refreshed into the other),
// bob one.
const (
	aliceToken, aliceRefreshed, bobToken = "alice-1", "alice-2", "bob-1"
	body                                 = `{"amount": 1500, "currency": "AZN"}`
)

// addTokens gives alice and bob their tokens, as an operator would.
func addTokens(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for token, account := range map[string]string{aliceToken: "acct_alice", aliceRefreshed: "acct_alice", bobToken: "acct_bob"} {
		_, err := pool.Exec(context.Background(),
			"INSERT INTO api_tokens VALUES (encode(sha256(convert_to($1, 'UTF8')), 'hex'), $2)", token, account)
		require.NoError(t, err)
	}
}

// testServer runs the program's routes in process, on a database of the
// shared test server (fsync off, so the store is made with pgstore.New:
// pgstore.Open would refuse it).
type testServer struct {
	url  string
	pool *pgxpool.Pool
	hook *faulthook.Hook
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pgstore.Migrate(ctx, pool))
	_, err = pool.Exec(ctx, tables)
	require.NoError(t, err)
	addTokens(t, pool)
	s := &testServer{pool: pool}
	s.hook = faulthook.New(func(ctx context.Context) (faulthook.Stats, error) {
		n := s.count(t, "SELECT count(*) FROM payments")
		return faulthook.Stats{Payments: n, ProviderCharges: n}, nil
	})
	// The store's bounds are a production server's answer to a database
	// that does not answer in time (a 503). A test's database on a busy
	// machine may be slow, and is not what the tests here test.
	store := pgstore.New(pool, &pgstore.Options{AcquireTimeout: time.Minute, CommitTimeout: time.Minute})
	srv := httptest.NewServer(routes(pool, store, s.hook))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *testServer) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, s.pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) problemType(t *testing.T) string {
	t.Helper()
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal([]byte(a.body), &p), a.body)
	return p.Type
}

func do(t *testing.T, method, url, token, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (s *testServer) pay(t *testing.T, token, key, body string) answer {
	t.Helper()
	return do(t, http.MethodPost, s.url+"/payments", token, key, body)
}

func (s *testServer) lookup(t *testing.T, token, key string) answer {
	t.Helper()
	return do(t, http.MethodGet, s.url+"/payments?idempotency_key="+url.QueryEscape(key), token, "", "")
}

func paymentID(t *testing.T, a answer) string {
	t.Helper()
	var p struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(a.body), &p), a.body)
	require.NotEmpty(t, p.ID, a.body)
	return p.ID
}

func TestPayments(t *testing.T) {
	s := newTestServer(t)

	t.Run("a retry with the same key pays once and gets the stored answer", func(t *testing.T) {
		first := s.pay(t, aliceToken, "k-retry", body)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		assert.Empty(t, first.header.Get("Idempotent-Replayed"))
		again := s.pay(t, aliceToken, "k-retry", `{"currency": "AZN", "amount": 1500}`)
		assert.Equal(t, http.StatusCreated, again.status)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, 1, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-retry'"))
	})

	t.Run("a token refreshed between two attempts is the same caller", func(t *testing.T) {
		first := s.pay(t, aliceToken, "k-refresh", body)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		again := s.pay(t, aliceRefreshed, "k-refresh", body)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"), "the refreshed token's retry was not replayed: %s", again.body)
		assert.Equal(t, 1, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-refresh'"))
	})

	t.Run("another account's request with the same key is its own payment", func(t *testing.T) {
		alice := s.pay(t, aliceToken, "k-shared", body)
		bob := s.pay(t, bobToken, "k-shared", body)
		require.Equal(t, http.StatusCreated, alice.status, alice.body)
		require.Equal(t, http.StatusCreated, bob.status, bob.body)
		assert.Empty(t, bob.header.Get("Idempotent-Replayed"), "bob got alice's stored answer")
		assert.NotEqual(t, paymentID(t, alice), paymentID(t, bob))
		assert.Equal(t, 1, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-shared' AND account = 'acct_bob'"))
	})

	t.Run("a request without a known token is refused and does nothing", func(t *testing.T) {
		for _, token := range []string{"", "stolen", strings.Repeat("x", 600)} {
			a := s.pay(t, token, "k-anonymous", body)
			assert.Equal(t, http.StatusUnauthorized, a.status)
			assert.NotEmpty(t, a.header.Get("WWW-Authenticate"))
		}
		assert.Zero(t, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-anonymous'"))
		assert.Zero(t, s.count(t, "SELECT count(*) FROM idempotency_records WHERE key = 'k-anonymous'"))
	})

	t.Run("an invalid body is refused and leaves the key free", func(t *testing.T) {
		bad := s.pay(t, aliceToken, "k-invalid", `{"amount": -5, "currency": "AZN"}`)
		assert.Equal(t, http.StatusBadRequest, bad.status)
		good := s.pay(t, aliceToken, "k-invalid", body)
		assert.Equal(t, http.StatusCreated, good.status, good.body)
	})
}

func TestLookup(t *testing.T) {
	s := newTestServer(t)
	paid := s.pay(t, aliceToken, "k-paid", body)
	require.Equal(t, http.StatusCreated, paid.status, paid.body)

	t.Run("finds the payment made under the key, marked as the server's", func(t *testing.T) {
		a := s.lookup(t, aliceRefreshed, "k-paid")
		require.Equal(t, http.StatusOK, a.status, a.body)
		assert.Equal(t, paymentID(t, paid), paymentID(t, a))
		assert.Equal(t, "k-paid", a.header.Get("Idempotency-Key"))
		assert.Equal(t, "no-store", a.header.Get("Cache-Control"))
	})

	t.Run("a quoted key is the bare key", func(t *testing.T) {
		a := s.lookup(t, aliceToken, `"k-paid"`)
		require.Equal(t, http.StatusOK, a.status, a.body)
		assert.Equal(t, paymentID(t, paid), paymentID(t, a))
		assert.Equal(t, `"k-paid"`, a.header.Get("Idempotency-Key"), "the key is echoed as sent")
	})

	t.Run("an unused key is 404 idempotency-key-unused", func(t *testing.T) {
		a := s.lookup(t, aliceToken, "k-never")
		assert.Equal(t, http.StatusNotFound, a.status)
		assert.Equal(t, "https://idem.dev/problems/idempotency-key-unused", a.problemType(t))
		assert.Equal(t, "k-never", a.header.Get("Idempotency-Key"))
	})

	t.Run("another account never sees the payment", func(t *testing.T) {
		a := s.lookup(t, bobToken, "k-paid")
		assert.Equal(t, http.StatusNotFound, a.status, a.body)
	})

	t.Run("an invalid key is 400 and a missing one too", func(t *testing.T) {
		assert.Equal(t, http.StatusBadRequest, s.lookup(t, aliceToken, "a b").status)
		assert.Equal(t, http.StatusBadRequest, s.lookup(t, aliceToken, strings.Repeat("k", 256)).status)
		assert.Equal(t, http.StatusBadRequest, do(t, http.MethodGet, s.url+"/payments", aliceToken, "", "").status)
	})

	t.Run("finds the payment after its record is gone", func(t *testing.T) {
		_, err := s.pool.Exec(context.Background(), "DELETE FROM idempotency_records WHERE key = 'k-paid'")
		require.NoError(t, err)
		a := s.lookup(t, aliceToken, "k-paid")
		require.Equal(t, http.StatusOK, a.status, a.body)
		assert.Equal(t, paymentID(t, paid), paymentID(t, a))
	})

	t.Run("a caller without a known token is refused", func(t *testing.T) {
		assert.Equal(t, http.StatusUnauthorized, s.lookup(t, "", "k-paid").status)
	})
}

// arm arms a fault on the hook through its HTTP protocol.
func (s *testServer) arm(t *testing.T, f string) answer {
	t.Helper()
	srv := httptest.NewServer(s.hook)
	defer srv.Close()
	return do(t, http.MethodPost, srv.URL+"/faults", "", "", f)
}

// heldEnd is how a request the delay fault held ended.
type heldEnd struct {
	status int
	err    error
}

func TestFaultHook(t *testing.T) {
	s := newTestServer(t)

	t.Run("the error fault answers 500 and keeps nothing; the retry pays", func(t *testing.T) {
		require.Equal(t, http.StatusCreated, s.arm(t, `{"fault": "error", "key": "k-error"}`).status)
		failed := s.pay(t, aliceToken, "k-error", body)
		assert.Equal(t, http.StatusInternalServerError, failed.status, failed.body)
		assert.Equal(t, "k-error", failed.header.Get("Idempotency-Key"), "the middleware answered it")
		assert.Zero(t, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-error'"))
		retry := s.pay(t, aliceToken, "k-error", body)
		assert.Equal(t, http.StatusCreated, retry.status, retry.body)
		assert.Empty(t, retry.header.Get("Idempotent-Replayed"))
		assert.Equal(t, 1, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-error'"))
	})

	t.Run("the crash fault kills the worker after its payment row, and the row is not kept", func(t *testing.T) {
		require.Equal(t, http.StatusCreated, s.arm(t, `{"fault": "crash_after_provider", "key": "k-crash"}`).status)
		req, err := http.NewRequest(http.MethodPost, s.url+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k-crash")
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("the crashed worker answered %d", resp.StatusCode)
		}
		assert.Zero(t, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-crash'"))
		retry := s.pay(t, aliceToken, "k-crash", body)
		assert.Equal(t, http.StatusCreated, retry.status, retry.body)
		assert.Equal(t, 1, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-crash'"))
	})

	t.Run("the delay fault holds the work: lookups and duplicates meanwhile get 409", func(t *testing.T) {
		require.Equal(t, http.StatusCreated, s.arm(t, `{"fault": "delay", "key": "k-delay", "delay_ms": 10000}`).status)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		held := make(chan heldEnd, 1)
		// The held request has a connection of its own. A 409 means an
		// earlier copy of it holds the key: net/http resends a keyed POST
		// whose reused connection broke. A client sends it again then.
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		go func() {
			for try := 1; ; try++ {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/payments", strings.NewReader(body))
				req.Header.Set("Idempotency-Key", "k-delay")
				req.Header.Set("Authorization", "Bearer "+aliceToken)
				resp, err := hc.Do(req)
				end := heldEnd{err: err}
				if err == nil {
					resp.Body.Close()
					end.status = resp.StatusCode
				}
				if end.status != http.StatusConflict || try == 100 {
					held <- end
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		// Until the held request is inside its transaction the key is
		// unused; then it reads as running until the request ends.
		for {
			a := s.lookup(t, aliceToken, "k-delay")
			if a.status == http.StatusConflict {
				assert.NotEmpty(t, a.header.Get("Retry-After"))
				break
			}
			require.Equal(t, http.StatusNotFound, a.status, a.body)
			select {
			case end := <-held:
				t.Fatalf("the held request ended (status %d, error %v) before a lookup read its key as running", end.status, end.err)
			default:
			}
		}
		dup := s.pay(t, aliceToken, "k-delay", body)
		assert.Equal(t, http.StatusConflict, dup.status, dup.body)
		assert.NotEmpty(t, dup.header.Get("Retry-After"))
		// The client of the held request leaves: nothing is kept, and the
		// retry, once the held request has ended, is done.
		cancel()
		assert.Error(t, (<-held).err)
		assert.Zero(t, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-delay'"))
		retry := s.pay(t, aliceToken, "k-delay", body)
		for range 500 {
			if retry.status != http.StatusConflict {
				break
			}
			time.Sleep(10 * time.Millisecond) // the held request's rollback, after its client left
			retry = s.pay(t, aliceToken, "k-delay", body)
		}
		assert.Equal(t, http.StatusCreated, retry.status, retry.body)
		assert.Empty(t, retry.header.Get("Idempotent-Replayed"), "the held request's answer was stored")
		assert.Equal(t, 1, s.count(t, "SELECT count(*) FROM payments WHERE idempotency_key = 'k-delay'"))
	})

	t.Run("stats count the payments", func(t *testing.T) {
		srv := httptest.NewServer(s.hook)
		defer srv.Close()
		a := do(t, http.MethodGet, srv.URL+"/stats", "", "", "")
		require.Equal(t, http.StatusOK, a.status)
		var st faulthook.Stats
		require.NoError(t, json.Unmarshal([]byte(a.body), &st))
		n := s.count(t, "SELECT count(*) FROM payments")
		assert.Equal(t, faulthook.Stats{Payments: n, ProviderCharges: n}, st)
	})

	t.Run("a fault it does not have, or out of bounds, is refused", func(t *testing.T) {
		for _, f := range []string{`{"fault": "reset", "key": "k"}`, `{"fault": "error"}`,
			`{"fault": "delay", "key": "k", "delay_ms": 10001}`, `{"fault": "delay", "key": "k"}`,
			`{"fault": "error", "key": "k", "path": "/"}`, `not json`} {
			assert.Equal(t, http.StatusBadRequest, s.arm(t, f).status, f)
		}
	})

	t.Run("it keeps at most MaxPending faults", func(t *testing.T) {
		h := faulthook.New(nil)
		srv := httptest.NewServer(h)
		defer srv.Close()
		for i := range faulthook.MaxPending {
			f, _ := json.Marshal(map[string]any{"fault": "error", "key": "k-full-" + string(rune('a'+i%26)) + strings.Repeat("x", i)})
			require.Equal(t, http.StatusCreated, do(t, http.MethodPost, srv.URL+"/faults", "", "", string(f)).status)
		}
		full := do(t, http.MethodPost, srv.URL+"/faults", "", "", `{"fault": "error", "key": "one-more"}`)
		assert.Equal(t, http.StatusServiceUnavailable, full.status, full.body)
	})
}

// TestDoc checks docs/SERVER.md's copy of the program.
func TestDoc(t *testing.T) {
	// Docs/SERVER.md's server program is this file, character for character,
	// so the documented server is the one the tests run and idemcheck
	// certifies.
	t.Run("shows the program", func(t *testing.T) {
		doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "SERVER.md"))
		require.NoError(t, err)
		src, err := os.ReadFile("main.go")
		require.NoError(t, err)
		found := 0
		for _, b := range doccheck.Blocks(string(doc)) {
			if b.Marker == "program server" {
				found++
				if line, doc, file := firstDifference(b.Text, string(src)); line > 0 {
					t.Errorf("docs/SERVER.md's program (line %d of its block) is not examples/server/main.go:\ndoc:  %q\nfile: %q\ncopy the file into the block", line, doc, file)
				}
			}
		}
		assert.Equal(t, 1, found, "docs/SERVER.md has no program block marked <!-- doccheck: program server -->")
	})
}

// firstDifference returns the first line (from 1) where a and b differ,
// and that line of each; 0 when they are equal.
func firstDifference(a, b string) (int, string, string) {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < max(len(al), len(bl)); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y || (i >= len(al)) != (i >= len(bl)) {
			return i + 1, x, y
		}
	}
	return 0, "", ""
}

// tokenDigest is what api_tokens keeps for token.
func tokenDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// TestTokens checks what the program keeps of a caller's token.
func TestTokens(t *testing.T) {
	t.Run("are kept as digests", func(t *testing.T) {
		s := newTestServer(t)
		assert.Equal(t, 1, s.count(t, "SELECT count(*) FROM api_tokens WHERE digest = $1", tokenDigest(aliceToken)),
			"the SQL that adds a token and the server's digest differ")
		assert.Zero(t, s.count(t, "SELECT count(*) FROM api_tokens WHERE digest = $1 OR account = $1", aliceToken))
	})
}
