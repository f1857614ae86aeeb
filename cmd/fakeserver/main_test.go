package main

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program")
	}
	bin := filepath.Join(t.TempDir(), "fakeserver")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-sweep-every", "0")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	lines := bufio.NewScanner(stderr)
	require.True(t, lines.Scan(), "no first log line")
	m := regexp.MustCompile(`msg=listening addr=(\S+)`).FindStringSubmatch(lines.Text())
	require.NotNil(t, m, "first line: %s", lines.Text())
	base := "http://" + m[1]

	body := `{"amount":1500,"currency":"AZN","customer":"cus_1"}`
	for _, want := range []string{"outcome=created", "outcome=replayed"} {
		r, err := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		require.True(t, lines.Scan())
		assert.Contains(t, lines.Text(), want)
		assert.Contains(t, lines.Text(), "key=k1")
	}
	resp, err := http.Get(base + "/_fake/stats")
	require.NoError(t, err)
	stats, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.JSONEq(t, `{"payments":1,"provider_charges":1,"executions":1,"records":1,"in_progress":0,"requests":2}`, string(stats))
	http.DefaultClient.CloseIdleConnections()

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() {
		_, _ = io.Copy(io.Discard, stderr)
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		assert.NoError(t, err, "clean exit on SIGTERM")
	case <-time.After(20 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-key-format", "ulid"}, 2, `-key-format must be "any" or "uuid"`},
		{[]string{"-lease", "0s"}, 2, "-lease must be positive"},
		{[]string{"-retention", "-1h"}, 2, "-retention must be positive"},
		{[]string{"-processing-delay", "-1s"}, 2, "must not be negative"},
		{[]string{"-sweep-every", "soon"}, 2, "invalid value"},
		{[]string{"-nope"}, 2, "flag provided but not defined"},
		{[]string{"extra"}, 2, "unexpected argument"},
		{[]string{"-h"}, 0, "/_fake/faults"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var buf bytes.Buffer
			assert.Equal(t, tt.code, run(tt.args, &buf))
			assert.Contains(t, buf.String(), tt.msg)
		})
	}
}
