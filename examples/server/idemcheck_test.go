package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idempotency/pgstore"
	"github.com/idemkit/idem/internal/long"
	"github.com/idemkit/idem/internal/pgtest"
)

// The body idemcheck sends: a payment this server accepts.
const checkBody = `{"amount": 1500, "currency": "AZN"}`

// TestIdemcheck runs the program, built as a user builds it, on a
// PostgreSQL server of its own with fsync on (pgstore.Open refuses one
// without), and certifies it with idemcheck, built the same way, with two
// callers and the lookup. .ci/example-server runs it.
func TestIdemcheck(t *testing.T) {
	long.Skip(t, "starts a PostgreSQL server of its own and certifies the built program with the built idemcheck")
	if raceEnabled {
		// The programs it runs are built without the race detector, so a
		// race run would repeat the plain one; the handlers' races are
		// the in-process tests' to find.
		t.Skip("the programs it checks are built without -race: go test without -race runs it")
	}
	srv, err := pgtest.Start(pgtest.Options{Durable: true})
	if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv(pgtest.EnvRequire) != "1" {
		t.Skip(err)
	}
	require.NoError(t, err)
	defer func() { assert.NoError(t, srv.Stop()) }()
	dsn := srv.DSN("postgres")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pgstore.Migrate(ctx, pool))
	_, err = pool.Exec(ctx, tables)
	require.NoError(t, err)
	addTokens(t, pool)

	bin := t.TempDir()
	build(t, filepath.Join(bin, "payments"), ".")
	build(t, filepath.Join(bin, "idemcheck"), "../../cmd/idemcheck")

	t.Run("with the fault hook every row passes, scoping and lookup included", func(t *testing.T) {
		addr, hook := freeAddr(t), freeAddr(t)
		start(t, filepath.Join(bin, "payments"), dsn, "-addr", addr, "-fault-hook", hook)
		rep := idemcheck(t, filepath.Join(bin, "idemcheck"), addr, "-admin", "http://"+hook+"/")
		for _, r := range rep.Rows {
			assert.Equal(t, "PASS", r.Status, "%s: %s", r.ID, r.Detail)
		}
		assert.Len(t, rep.Rows, 19)
	})

	t.Run("without the fault hook the fault rows SKIP, saying why, and the rest pass", func(t *testing.T) {
		addr := freeAddr(t)
		start(t, filepath.Join(bin, "payments"), dsn, "-addr", addr)
		rep := idemcheck(t, filepath.Join(bin, "idemcheck"), addr)
		for _, r := range rep.Rows {
			if r.ID == "5xx-not-stored" || r.ID == "dead-worker" {
				assert.Equal(t, "SKIP", r.Status, "%s: %s", r.ID, r.Detail)
				assert.Contains(t, r.Detail, "no fault hook", r.ID)
				continue
			}
			assert.Equal(t, "PASS", r.Status, "%s: %s", r.ID, r.Detail)
		}
	})

	var payments, records int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&payments))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_records").Scan(&records))
	assert.Equal(t, records, payments, "a payment for every record, and none without one")
}

type report struct {
	Rows []struct {
		ID, Status, Detail string
	}
	Sent int `json:"sent_requests"`
}

// idemcheck runs the built idemcheck against the program at addr, as
// alice and bob, and returns its report.
func idemcheck(t *testing.T, bin, addr string, args ...string) report {
	t.Helper()
	base := "http://" + addr + "/payments"
	cmd := exec.Command(bin, append([]string{"-json", "-url", base, "-body", checkBody,
		"-auth", "Bearer " + aliceToken, "-auth2", "Bearer " + bobToken,
		"-lookup", base + "?idempotency_key={key}", "-lease-wait", "30s"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep report
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "idemcheck (%v):\n%s%s", err, stderr.String(), stdout.String())
	var lines strings.Builder
	for _, r := range rep.Rows {
		fmt.Fprintf(&lines, "%s %-20s %s\n", r.Status, r.ID, r.Detail)
	}
	with := "without -admin"
	if len(args) > 0 {
		with = "with " + strings.Join(args, " ")
	}
	t.Logf("idemcheck %s, %d requests sent:\n%s", with, rep.Sent, lines.String())
	return rep
}

// build builds the package pkg into out.
func build(t *testing.T, out, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %s:\n%s", pkg, b)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// start starts the program and waits until it answers.
func start(t *testing.T, bin, dsn string, args ...string) {
	t.Helper()
	var logs bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	addr := args[1]
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + addr + "/payments")
		if err == nil {
			resp.Body.Close()
			t.Cleanup(stop)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "an unauthenticated request")
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("the program exited (%v):\n%s", err, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("the program did not answer within a minute: %v\n%s", err, logs.String())
		}
	}
}
