package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idemcheck/internal/contractcheck"
	"github.com/idemkit/idem/fakeserver"
)

func runArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestRun checks the program's report and exit status.
func TestRun(t *testing.T) {
	// Against the fake server without its fault endpoint, every row passes
	// but the two fault rows, which say why they are skipped; the plan comes
	// before the first row, the summary last, and the exit status is 0.
	t.Run("the fake server passes every row but the fault rows", func(t *testing.T) {
		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)
		code, out, errOut := runArgs(t, "-url", srv.URL+"/payments", "-admin", "off",
			"-auth", "Bearer caller-1", "-auth2", "Bearer caller-2", "-lookup", srv.URL+"/payments?idempotency_key={key}")
		require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3+len(contractcheck.Rows()), out)
		assert.Contains(t, lines[1], "sending at most 31 requests")
		for _, l := range lines[2 : len(lines)-1] {
			if strings.Contains(l, "5xx-not-stored") || strings.Contains(l, "dead-worker") {
				assert.Contains(t, l, "SKIP")
				assert.Contains(t, l, "the fault hook is off (-admin off)")
				continue
			}
			assert.True(t, strings.HasPrefix(l, "PASS "), l)
		}
		assert.Equal(t, "19 rows: 17 PASS, 0 FAIL, 2 SKIP; 31 requests sent", lines[len(lines)-1])
	})

	// -json prints the report as JSON on stdout and the plan on stderr.
	t.Run("-json prints the report on stdout and the plan on stderr", func(t *testing.T) {
		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)
		code, out, errOut := runArgs(t, "-url", srv.URL+"/payments", "-json", "-admin", "off")
		require.Equal(t, 0, code, errOut)
		var rep contractcheck.Report
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		assert.Equal(t, srv.URL+"/payments", rep.URL)
		assert.Len(t, rep.Rows, len(contractcheck.Rows()))
		assert.Equal(t, 0, rep.Fail)
		assert.Equal(t, 5, rep.Skip, "scoping, lookup and lookup-miss, without -auth2 and -lookup, and the fault rows")
		assert.Equal(t, rep.Planned, rep.Sent)
		assert.Contains(t, errOut, "sending at most")
	})

	// A server that ignores the key and does the work every time fails, with
	// what was sent and what came back, and exit status 1.
	t.Run("a server that ignores the key fails with status 1", func(t *testing.T) {
		var n atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := n.Add(1)
			w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"%d"}`, id)
		}))
		t.Cleanup(srv.Close)
		code, out, _ := runArgs(t, "-url", srv.URL+"/payments", "-concurrency", "3")
		assert.Equal(t, 1, code)
		assert.Contains(t, out, "FAIL key-missing          wanted 400 https://idem.dev/problems/idempotency-key-missing, got 201\n"+
			"     costs a client: a client that forgot the key is served without protection and never learns it; its retries charge twice\n"+
			"     -> POST "+srv.URL+"/payments (no Idempotency-Key) body: ")
		assert.Contains(t, out, "     <- 201 Created Location: /payments/2 body: \"{\\\"id\\\":\\\"2\\\"}\"\n")
		assert.Contains(t, out, "FAIL concurrent")
		assert.Contains(t, out, "SKIP dead-worker          no fault hook: GET "+srv.URL+"/_fake/stats answered 201; a server that offers one is named by -admin URL")
		assert.Contains(t, out, "FAIL key-echo             answers not marked as the server's: a 201 with no Idempotency-Key")
		assert.Regexp(t, `19 rows: \d+ PASS, \d+ FAIL, \d+ SKIP; \d+ requests sent\n$`, out)
	})

	// -h documents the rows and flags; wrong flags and a body the server
	// refuses are exit status 2, with a message that says what to do.
	t.Run("-h documents the rows and bad input is status 2", func(t *testing.T) {
		code, _, errOut := runArgs(t, "-h")
		assert.Equal(t, 0, code)
		for _, r := range contractcheck.Rows() {
			assert.Contains(t, errOut, r.ID)
		}
		assert.Contains(t, errOut, "-lease-wait")

		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)
		body := filepath.Join(t.TempDir(), "body.json")
		require.NoError(t, os.WriteFile(body, []byte(`{"amount": 0, "currency": "AZN", "customer": "cus_1"}`), 0o600))
		for _, tt := range []struct {
			args []string
			want string
		}{
			{nil, "-url is required"},
			{[]string{"-url", "ftp://x/payments"}, `-url "ftp://x/payments" is not an http or https URL`},
			{[]string{"-url", srv.URL, "extra"}, `unexpected argument "extra"`},
			{[]string{"-url", srv.URL, "-concurrency", "1"}, "concurrency 1: give 2 to 50"},
			{[]string{"-url", srv.URL, "-lease-wait", "2h"}, "lease wait 2h0m0s: give up to 1h0m0s"},
			{[]string{"-url", srv.URL, "-method", "GET"}, "method GET: the contract covers POST and PATCH"},
			{[]string{"-url", srv.URL, "-lookup", srv.URL + "/payments"}, "must be an http or https URL with {key}"},
			{[]string{"-url", srv.URL, "-auth", "a", "-auth2", "a"}, "the two credentials are the same"},
			{[]string{"-url", srv.URL, "-body", "@" + body + ".missing"}, "-body: open"},
			{[]string{"-url", srv.URL + "/payments", "-body", "@" + body}, `the server did not accept the body with a fresh key: POST ` + srv.URL + `/payments -> 400 Bad Request`},
		} {
			code, _, errOut := runArgs(t, tt.args...)
			assert.Equal(t, 2, code, "%v", tt.args)
			assert.Contains(t, errOut, tt.want, "%v", tt.args)
		}
		assert.Equal(t, 0, srv.Stats().Payments, "a refused body creates nothing")
	})

	// -changed-body @FILE sends the file's bytes, not a body derived from
	// -body. A server that tells bodies apart passes the row with them.
	t.Run("-changed-body @FILE sends the file's bytes as the other body", func(t *testing.T) {
		changed := []byte(`{"amount": 777, "currency": "AZN", "customer": "cus_file"}`)
		file := filepath.Join(t.TempDir(), "changed.json")
		require.NoError(t, os.WriteFile(file, changed, 0o600))
		fake := fakeserver.NewHandler(nil)
		var seen atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			if bytes.Equal(b, changed) {
				seen.Add(1)
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			fake.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		code, out, errOut := runArgs(t, "-url", srv.URL+"/payments", "-admin", "off", "-changed-body", "@"+file)
		require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
		assert.Regexp(t, `(?m)^PASS changed-body\s`, out)
		assert.Equal(t, int64(1), seen.Load(), "the row sends the file's bytes once")
	})

	// A check interrupted (Ctrl-C) stops with status 2 and says so, instead
	// of reporting the failed requests as FAIL rows.
	t.Run("an interrupted check stops with status 2", func(t *testing.T) {
		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out, errOut bytes.Buffer
		code := run(ctx, []string{"-url", srv.URL + "/payments"}, &out, &errOut)
		assert.Equal(t, 2, code)
		assert.NotContains(t, out.String(), "FAIL")
		assert.Contains(t, errOut.String(), "context canceled")
	})
}
