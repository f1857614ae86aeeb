package doccheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestServerProgramPaysOnce runs docs/SERVER.md's server program against an
// empty PostgreSQL database, twice (a restart migrates again), and pays
// twice with one key: one payment row, the second answer the stored one;
// an invalid body is refused without using the key. The server is one of
// its own with fsync on, as the program's pgstore.Open requires.
func TestServerProgramPaysOnce(t *testing.T) {
	srv, err := pgtest.Start(pgtest.Options{Durable: true})
	if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv(pgtest.EnvRequire) != "1" {
		t.Skip(err)
	}
	require.NoError(t, err)
	defer func() { assert.NoError(t, srv.Stop()) }()
	dsn := srv.DSN("postgres")
	bin := buildProgram(t, "server")
	ctx := context.Background()

	for run := range 2 {
		base := startServer(t, bin, dsn)
		key := fmt.Sprintf("doc-key-%d", run)
		bad := post(t, base+"/payments", key, `{"amount": -5, "currency": "AZN"}`)
		assert.Equal(t, http.StatusBadRequest, bad.status, "run %d: the invalid body", run)

		first := post(t, base+"/payments", key, `{"amount": 1500, "currency": "AZN"}`)
		require.Equal(t, http.StatusCreated, first.status, "run %d: %s", run, first.body)
		assert.Empty(t, first.header.Get("Idempotent-Replayed"))
		second := post(t, base+"/payments", key, `{"currency": "AZN", "amount": 1500}`)
		assert.Equal(t, http.StatusCreated, second.status)
		assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, second.body, "the replay is the stored answer")
		assert.Equal(t, first.header.Get("Location"), second.header.Get("Location"))
	}

	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	var payments, records int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&payments))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_records").Scan(&records))
	assert.Equal(t, 2, payments, "one payment per key")
	assert.Equal(t, 2, records)
}

// startServer starts the program on a free port of loopback and waits
// until it answers.
func startServer(t *testing.T, bin, dsn string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	var logs bytes.Buffer
	cmd := exec.Command(bin, "-addr", addr)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/")
		if err == nil {
			resp.Body.Close()
			return base
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server program did not answer: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}
