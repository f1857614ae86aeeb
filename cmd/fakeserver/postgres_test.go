package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/pgtest"
)

// startProcesses builds the program and starts n processes of it on the
// database dsn, and returns their base URLs. They are killed when t ends.
func startProcesses(t *testing.T, n int, dsn string, args ...string) []string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fakeserver")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var urls []string
	for i := range n {
		cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-sweep-every", "0", "-postgres", dsn}, args...)...)
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		lines := bufio.NewScanner(stderr)
		require.True(t, lines.Scan(), "process %d wrote no log line", i)
		m := regexp.MustCompile(`msg=listening addr=(\S+)`).FindStringSubmatch(lines.Text())
		require.NotNil(t, m, "process %d's first line: %s", i, lines.Text())
		urls = append(urls, "http://"+m[1])
		drained := make(chan struct{})
		go func() { // keep reading so the process never blocks on its log
			defer close(drained)
			_, _ = io.Copy(io.Discard, stderr)
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-drained
			_ = cmd.Wait()
		})
	}
	return urls
}

func pay(t *testing.T, c *http.Client, base, key string) (int, []byte) {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
	require.NoError(t, err)
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Authorization", "Bearer storm")
	resp, err := c.Do(r)
	if err != nil {
		return 0, nil // a crash fault closes the connection
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, body
}

func stats(t *testing.T, base string) fakeserver.Stats {
	t.Helper()
	resp, err := http.Get(base + "/_fake/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var s fakeserver.Stats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// TestPostgres checks several processes of the program on one
// PostgreSQL database.
func TestPostgres(t *testing.T) {
	// Three processes on one database: 300 concurrent requests on one key,
	// spread over them, make one execution and one charge; the rest are
	// replays of its answer or 409s.
	t.Run("three processes storming one key make one charge", func(t *testing.T) {
		if testing.Short() {
			t.Skip("builds the program and starts three processes")
		}
		dsn := pgtest.DSN(t)
		urls := startProcesses(t, 3, dsn, "-processing-delay", "200ms")
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
		defer c.CloseIdleConnections()

		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			codes  = map[int]int{}
			bodies = map[string]bool{}
		)
		start := make(chan struct{})
		for i := range 300 {
			wg.Go(func() {
				<-start
				code, body := pay(t, c, urls[i%3], "storm-key")
				mu.Lock()
				defer mu.Unlock()
				codes[code]++
				if code == http.StatusCreated {
					bodies[string(body)] = true
				}
			})
		}
		close(start)
		wg.Wait()
		t.Logf("storm over 3 processes: %d created or replayed (201), %d conflicts (409), other %v",
			codes[http.StatusCreated], codes[http.StatusConflict], codes)
		assert.Equal(t, 300, codes[http.StatusCreated]+codes[http.StatusConflict], "every answer is 201 or 409: %v", codes)
		assert.Positive(t, codes[http.StatusCreated])
		assert.Len(t, bodies, 1, "every 201 carries the one payment")

		// The key settles: every process replays the one payment.
		for _, u := range urls {
			code, body := pay(t, c, u, "storm-key")
			assert.Equal(t, http.StatusCreated, code)
			assert.True(t, bodies[string(body)], "process %s answers another payment: %s", u, body)
		}
		want := fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, InProgress: 0, Requests: 303}
		for _, u := range urls {
			assert.Equal(t, want, stats(t, u), "stats of %s", u)
		}
	})

	// A worker dies in one process after the provider charged; once its lease
	// has ended, a request to another process takes the record over, finds the
	// charge at the provider, and makes no second one.
	t.Run("another process takes a dead worker's record over", func(t *testing.T) {
		if testing.Short() {
			t.Skip("builds the program and starts three processes")
		}
		dsn := pgtest.DSN(t)
		urls := startProcesses(t, 3, dsn, "-lease", "1m")
		c := &http.Client{}
		defer c.CloseIdleConnections()

		fault, err := http.Post(urls[0]+"/_fake/faults", "application/json",
			strings.NewReader(`{"fault":"crash_after_provider","key":"dead-key"}`))
		require.NoError(t, err)
		fault.Body.Close()
		require.Equal(t, http.StatusCreated, fault.StatusCode)

		code, _ := pay(t, c, urls[0], "dead-key")
		require.Zero(t, code, "the worker in process 0 should have died without answering")
		assert.Equal(t, fakeserver.Stats{ProviderCharges: 1, Executions: 1, Records: 1, InProgress: 1, Requests: 1}, stats(t, urls[1]))

		// The lease is alive: the other processes answer 409.
		code, _ = pay(t, c, urls[1], "dead-key")
		assert.Equal(t, http.StatusConflict, code)

		// The lease ends (the test moves its end into the past rather than
		// waiting a minute).
		conn, err := pgx.Connect(context.Background(), dsn)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		tag, err := conn.Exec(context.Background(),
			"UPDATE idempotency_records SET locked_until = now() - interval '1 second' WHERE key = 'dead-key'")
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())

		code, body := pay(t, c, urls[2], "dead-key")
		assert.Equal(t, http.StatusCreated, code, "%s", body)
		code, replay := pay(t, c, urls[1], "dead-key")
		assert.Equal(t, http.StatusCreated, code)
		assert.Equal(t, string(body), string(replay))
		assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 2, Records: 1, InProgress: 0, Requests: 4},
			stats(t, urls[0]), fmt.Sprintf("after the takeover; the payment: %s", body))
	})

	// A worker in one process charges the provider and the process is killed
	// (SIGKILL). Past the lease and the retention, another process, and one
	// started afterwards, answer the lookup with the payment, before and
	// after a sweep; the charge is never lost and never made twice.
	t.Run("the lookup finds the charge of a killed process", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.DSN(t)
		bin := buildProgram(t)
		addr0, p0, _ := startProgram(t, bin, "-postgres", dsn, "-lease", "1m", "-retention", "2m")
		base0 := "http://" + addr0
		c := &http.Client{}
		defer c.CloseIdleConnections()
		fault, err := http.Post(base0+"/_fake/faults", "application/json",
			strings.NewReader(`{"fault":"crash_after_provider","key":"killed-key"}`))
		require.NoError(t, err)
		fault.Body.Close()
		require.Equal(t, http.StatusCreated, fault.StatusCode)
		code, _ := pay(t, c, base0, "killed-key")
		require.Zero(t, code, "the worker should have died without answering")
		require.NoError(t, p0.Process.Kill())
		_, _ = p0.Process.Wait()

		addr1, _, _ := startProgram(t, bin, "-postgres", dsn, "-lease", "1m", "-retention", "2m")
		base1 := "http://" + addr1
		// Past the lease and the retention, on the database's clock (the test
		// moves the record's times rather than waiting two minutes).
		conn, err := pgx.Connect(context.Background(), dsn)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		tag, err := conn.Exec(context.Background(), `UPDATE idempotency_records
		SET locked_until = clock_timestamp() - interval '1 minute', expires_at = clock_timestamp() - interval '1 second'
		WHERE key = 'killed-key'`)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())

		lookup := func(base string) (int, string) {
			r, err := http.NewRequest(http.MethodGet, base+"/payments?idempotency_key=killed-key", nil)
			require.NoError(t, err)
			r.Header.Set("Authorization", "Bearer storm") // the caller pay uses
			resp, err := c.Do(r)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(body)
		}
		code, found := lookup(base1)
		require.Equal(t, http.StatusOK, code, "the lookup in another process: %s", found)
		assert.Contains(t, found, `"amount":1500`)
		sweep, err := http.Post(base1+"/_fake/sweep", "application/json", nil)
		require.NoError(t, err)
		sweep.Body.Close()
		addr2, _, _ := startProgram(t, bin, "-postgres", dsn)
		code, again := lookup("http://" + addr2)
		assert.Equal(t, http.StatusOK, code, "the lookup in a process started afterwards, after a sweep: %s", again)
		assert.Equal(t, found, again)
		st := stats(t, base1)
		assert.Equal(t, 1, st.Payments, "the charge is a payment")
		assert.Equal(t, 1, st.ProviderCharges)
	})

	// A payment's commit waits on a lock that another session holds; SIGTERM
	// still ends the program within its shutdown timeout, and the payment
	// does not commit after the program said it stopped (its record stays
	// IN_PROGRESS for a resend to take over).
	t.Run("it stops within the shutdown timeout while a commit waits", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.DSN(t)
		addr, cmd, lines := startProgram(t, buildProgram(t), "-postgres", dsn, "-shutdown-timeout", "500ms")
		var (
			logMu  sync.Mutex
			logged strings.Builder
		)
		done := make(chan error, 1)
		go func() {
			for lines.Scan() {
				logMu.Lock()
				logged.WriteString(lines.Text() + "\n")
				logMu.Unlock()
			}
			done <- cmd.Wait()
		}()
		ctx := context.Background()
		locker, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer locker.Close(ctx)
		tx, err := locker.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "LOCK TABLE fake_payments IN EXCLUSIVE MODE")
		require.NoError(t, err)

		go func() {
			c := &http.Client{}
			defer c.CloseIdleConnections()
			pay(t, c, "http://"+addr, "locked-key")
		}()
		// Wait until the payment's commit waits on the lock.
		watcher, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer watcher.Close(ctx)
		require.Eventually(t, func() bool {
			var waiting int
			err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO fake_payments%'`).Scan(&waiting)
			return err == nil && waiting == 1
		}, time.Minute, 10*time.Millisecond, "the commit never waited on the lock")

		start := time.Now()
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-done:
			logMu.Lock()
			defer logMu.Unlock()
			assert.NoError(t, err, "exit status 0; log:\n%s", logged.String())
			assert.Contains(t, logged.String(), "msg=stopped")
			t.Logf("exited %v after SIGTERM (shutdown timeout 500ms), the lock still held", time.Since(start).Round(10*time.Millisecond))
		case <-time.After(20 * time.Second):
			t.Fatal("no exit 20 s after SIGTERM while the lock is held")
		}
		require.NoError(t, tx.Rollback(ctx))

		// Once the lock is gone, nothing commits: every session of the
		// program has ended without committing.
		var payments, inProgress int
		require.Eventually(t, func() bool {
			var sessions int
			err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend'
			AND pid NOT IN (pg_backend_pid(), $1)`, locker.PgConn().PID()).Scan(&sessions)
			return err == nil && sessions == 0
		}, time.Minute, 10*time.Millisecond, "the program's sessions outlived it")
		require.NoError(t, watcher.QueryRow(ctx, `SELECT (SELECT count(*) FROM fake_payments),
		(SELECT count(*) FROM idempotency_records WHERE status = 'IN_PROGRESS')`).Scan(&payments, &inProgress))
		assert.Zero(t, payments, "a payment committed after the program stopped")
		assert.Equal(t, 1, inProgress, "the record waits for a resend to take it over")
	})

	// The program with -key-format uuid on PostgreSQL. An iOS client sends
	// its key in upper case (UUID().uuidString) and a gateway lower-cases
	// the retry: one execution, one charge; each answer echoes the key as
	// its request sent it.
	t.Run("in UUID mode a key is taken in either case", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.DSN(t)
		addr, _, _ := startProgram(t, buildProgram(t), "-postgres", dsn, "-key-format", "uuid")
		base := "http://" + addr
		c := &http.Client{}
		defer c.CloseIdleConnections()
		var bodies []string
		for _, key := range []string{"8E03978E-40D5-43E8-BC93-6894A57F9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"} {
			r, err := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
			require.NoError(t, err)
			r.Header.Set("Idempotency-Key", key)
			resp, err := c.Do(r)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
			assert.Equal(t, key, resp.Header.Get("Idempotency-Key"), "the echo is the key as received")
			bodies = append(bodies, string(body))
		}
		assert.Equal(t, bodies[0], bodies[1], "the retry replays the payment")
		st := stats(t, base)
		assert.Equal(t, 1, st.Executions, "one execution")
		assert.Equal(t, 1, st.ProviderCharges, "one charge")
	})
}
