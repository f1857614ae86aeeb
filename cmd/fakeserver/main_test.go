package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildProgram builds the program into a temporary directory.
func buildProgram(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the program")
	}
	bin := filepath.Join(t.TempDir(), "fakeserver")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// startProgram starts the program with args and returns its base URL's
// host:port, the process, and its log lines after the first.
func startProgram(t *testing.T, bin string, args ...string) (string, *exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-sweep-every", "0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	lines := bufio.NewScanner(stderr)
	require.True(t, lines.Scan(), "no first log line")
	m := regexp.MustCompile(`msg=listening addr=(\S+)`).FindStringSubmatch(lines.Text())
	require.NotNil(t, m, "first line: %s", lines.Text())
	return m[1], cmd, lines
}

// newClient returns an HTTP client of the test's own, whose connections are
// closed when the test ends.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestProgram checks the program as its users run it: its flags, its
// timeouts, its signals and its limits.
func TestProgram(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	addr, cmd, lines := startProgram(t, buildProgram(t))
	base := "http://" + addr
	stderr := lines

	body := `{"amount":1500,"currency":"AZN","customer":"cus_1"}`
	for _, want := range []string{"outcome=created", "outcome=replayed"} {
		r, err := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", "k1")
		resp, err := client.Do(r)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		require.True(t, lines.Scan())
		assert.Contains(t, lines.Text(), want)
		assert.Contains(t, lines.Text(), "key=k1")
	}
	resp, err := client.Get(base + "/_fake/stats")
	require.NoError(t, err)
	stats, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.JSONEq(t, `{"payments":1,"provider_charges":1,"executions":1,"records":1,"in_progress":0,"requests":2}`, string(stats))
	client.CloseIdleConnections()

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() {
		for stderr.Scan() {
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		assert.NoError(t, err, "clean exit on SIGTERM")
	case <-time.After(20 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	t.Run("a delay fault holds the work past -read-timeout and commits", func(t *testing.T) {
		t.Parallel()
		client := newClient(t)
		addr, _, _ := startProgram(t, buildProgram(t), "-read-timeout", "2s", "-write-timeout", "20s")
		base := "http://" + addr

		resp, err := client.Post(base+"/_fake/faults", "application/json", strings.NewReader(`{"fault":"delay","delay_ms":3000}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)

		r, err := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", "slow-1")
		start := time.Now()
		resp, err = client.Do(r)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("after %v: %d %s", time.Since(start).Round(time.Millisecond), resp.StatusCode, body)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "a 3s delay fault, under -write-timeout 20s, did not hold the work and commit")
	})

	t.Run("bad flags are refused", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			args []string
			code int
			msg  string
		}{
			{[]string{"-key-format", "ulid"}, 2, `-key-format must be "any" or "uuid"`},
			{[]string{"-lease", "0s"}, 2, "-lease must be positive"},
			{[]string{"-retention", "10s"}, 2, "-retention (10s) must be longer than -lease (30s)"},
			{[]string{"-retention", "-1h"}, 2, "-retention must be positive"},
			{[]string{"-processing-delay", "-1s"}, 2, "must not be negative"},
			{[]string{"-sweep-every", "soon"}, 2, "invalid value"},
			{[]string{"-read-timeout", "0s"}, 2, "must be positive"},
			{[]string{"-idle-timeout", "-1s"}, 2, "must be positive"},
			{[]string{"-shutdown-timeout", "0s"}, 2, "must be positive"},
			{[]string{"-max-records", "0"}, 2, "-max-records, -max-payments and -max-orders must be positive"},
			{[]string{"-max-orders", "0"}, 2, "-max-records, -max-payments and -max-orders must be positive"},
			{[]string{"-max-payments", "-1"}, 2, "-max-records, -max-payments and -max-orders must be positive"},
			{[]string{"-write-timeout", "1s", "-processing-delay", "1s"}, 2, "must be longer than -processing-delay"},
			// A payment slower than its lease is taken over by the client's
			// resend while it runs: the handler runs twice for one key. (The
			// address is one that cannot be listened on, so that a run that
			// accepts the flags ends.)
			{[]string{"-processing-delay", "30s", "-addr", "256.0.0.1:1"}, 2, "-lease (30s) must be longer than -processing-delay (30s)"},
			{[]string{"-nope"}, 2, "flag provided but not defined"},
			{[]string{"extra"}, 2, "unexpected argument"},
			{[]string{"-h"}, 0, "/_fake/faults"},
			{[]string{"-h"}, 0, "-shutdown-timeout"},
			{[]string{"-h"}, 0, "-max-payments"},
		}
		for _, tt := range tests {
			t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
				var buf bytes.Buffer
				assert.Equal(t, tt.code, run(tt.args, &buf))
				assert.Contains(t, buf.String(), tt.msg)
			})
		}
	})

	// With a one-second read, write and idle timeout, no slow client keeps
	// its connection. The limit of the assertion is generous (30 s); the log
	// reports how long each kind was held.
	t.Run("slow clients are dropped", func(t *testing.T) {
		t.Parallel()
		addr, _, lines := startProgram(t, buildProgram(t),
			"-read-header-timeout", "1s", "-read-timeout", "1s", "-write-timeout", "2s", "-idle-timeout", "1s")
		go func() {
			for lines.Scan() {
			}
		}()
		const perKind = 10
		opened := time.Now()
		conns := holdSlowClients(t, addr, perKind)
		type result struct {
			closed bool
			after  time.Duration
		}
		results := make(map[string][]result)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for name, cs := range conns {
			for _, c := range cs {
				wg.Go(func() {
					closed, after := closedWithin(c, opened, 30*time.Second)
					mu.Lock()
					results[name] = append(results[name], result{closed, after})
					mu.Unlock()
				})
			}
		}
		wg.Wait()
		for _, sc := range slowClients {
			var held int
			var longest time.Duration
			for _, r := range results[sc.name] {
				if !r.closed {
					held++
				}
				longest = max(longest, r.after)
			}
			assert.Zero(t, held, "%s: %d of %d connections still held after 30 s", sc.name, held, perKind)
			t.Logf("%s: %d of %d held; the last closed %v after opening", sc.name, held, perKind, longest.Round(10*time.Millisecond))
		}
	})

	// SIGTERM with slow clients still connected ends the program with status
	// 0 once the drain time is over, rather than waiting on them.
	t.Run("SIGTERM ends it with status 0 after the drain time", func(t *testing.T) {
		t.Parallel()
		client := newClient(t)
		addr, cmd, lines := startProgram(t, buildProgram(t), "-read-timeout", "1m", "-shutdown-timeout", "1s")
		var logged strings.Builder
		done := make(chan error, 1)
		go func() {
			for lines.Scan() {
				logged.WriteString(lines.Text() + "\n")
			}
			done <- cmd.Wait()
		}()
		holdSlowClients(t, addr, 5)
		// Let the server read the slow clients' requests before the signal.
		resp, err := client.Get("http://" + addr + "/_fake/stats")
		require.NoError(t, err)
		resp.Body.Close()
		client.CloseIdleConnections()

		start := time.Now()
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-done:
			assert.NoError(t, err, "exit status 0; log:\n%s", logged.String())
			assert.Contains(t, logged.String(), "msg=stopped")
			t.Logf("exited %v after SIGTERM", time.Since(start).Round(10*time.Millisecond))
		case <-time.After(30 * time.Second):
			t.Fatal("no exit 30 s after SIGTERM")
		}
	})

	// -max-payments reaches the server: past it, a new payment is refused
	// with 503 storage-full and nothing is charged.
	t.Run("-max-payments caps the payments", func(t *testing.T) {
		t.Parallel()
		client := newClient(t)
		addr, _, lines := startProgram(t, buildProgram(t), "-max-payments", "1")
		go func() {
			for lines.Scan() {
			}
		}()
		post := func(key string) (int, string) {
			r, err := http.NewRequest(http.MethodPost, "http://"+addr+"/payments",
				strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
			require.NoError(t, err)
			r.Header.Set("Idempotency-Key", key)
			resp, err := client.Do(r)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		code, _ := post("k1")
		assert.Equal(t, http.StatusCreated, code)
		code, body := post("k2")
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Contains(t, body, "https://idem.dev/problems/storage-full")
		resp, err := client.Get("http://" + addr + "/_fake/stats")
		require.NoError(t, err)
		stats, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.JSONEq(t, `{"payments":1,"provider_charges":1,"executions":2,"records":1,"in_progress":0,"requests":2}`, string(stats))
	})
}

// slowClients are connections that never finish what they started, as the
// program must not keep them: an unfinished chunked body, a body shorter
// than its Content-Length, unfinished headers, and an idle keep-alive.
var slowClients = []struct{ name, send string }{
	{"unfinished chunked body", "POST /payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"amo\r\n"},
	{"short Content-Length body", "POST /payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 100\r\n\r\n{\"amount\":"},
	{"unfinished headers", "POST /payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\n"},
	{"idle keep-alive", "GET /payments HTTP/1.1\r\nHost: x\r\n\r\n"},
}

// holdSlowClients opens n connections of each kind of slowClients to addr.
func holdSlowClients(t *testing.T, addr string, n int) map[string][]net.Conn {
	t.Helper()
	conns := make(map[string][]net.Conn)
	for _, sc := range slowClients {
		for range n {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			_, err = io.WriteString(c, sc.send)
			require.NoError(t, err)
			conns[sc.name] = append(conns[sc.name], c)
		}
	}
	return conns
}

// closedWithin reads c until the server closes it, or until limit after
// opened, and reports whether it was closed and how long after opened.
func closedWithin(c net.Conn, opened time.Time, limit time.Duration) (bool, time.Duration) {
	_ = c.SetReadDeadline(opened.Add(limit))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, time.Since(opened)
	}
	return true, time.Since(opened) // EOF (io.Copy's nil) or reset
}
