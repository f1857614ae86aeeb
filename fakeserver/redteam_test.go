package fakeserver_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

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

// TestFaultThatCanNeverStrikeIsRefused: bad input gets a clear error.
// A Fault's Path "matches requests with exactly this URL path", and admin
// endpoints are never faulted. Path: POST /_fake/faults with a path no
// request can have: the lookup's URL with its query
// ("/payments?idempotency_key=K", as a tester faulting the lookup writes
// it), a percent-encoded path (requests are matched on the decoded path),
// or an admin path: each is taken (201), pending, and never strikes. The
// test that relies on it sees a clean run and concludes its client
// survived a fault it never met.
func TestFaultThatCanNeverStrikeIsRefused(t *testing.T) {
	s := fakeserver.NewServer(nil)
	t.Cleanup(s.Close)
	for _, path := range []string{"/payments?idempotency_key=k-1", "/pay%6Dents", "/_fake/stats"} {
		resp, err := s.Client().Post(s.URL+"/_fake/faults", "application/json",
			strings.NewReader(`{"fault":"error","path":"`+path+`"}`))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "path %q, which no faulted request can have, was taken: %s", path, body)
	}
}

// TestAdminFaultEchoIsWhatTheFaultDoes: POST /_fake/faults refuses
// "status" on any fault but status ("status is only for the status
// fault"), yet takes "delay_ms" on every fault and echoes it back. Path:
// {"fault":"drop_response","delay_ms":3000}: 201 with "delay_ms":3000 in
// the echo, as if the answer were dropped after 3s; the server drops it at
// once, since only the delay fault reads a delay. Bad input gets no error,
// and the echo describes a fault the server does not run.
func TestAdminFaultEchoIsWhatTheFaultDoes(t *testing.T) {
	s := fakeserver.NewServer(nil)
	t.Cleanup(s.Close)
	resp, err := s.Client().Post(s.URL+"/_fake/faults", "application/json",
		strings.NewReader(`{"fault":"drop_response","delay_ms":3000}`))
	require.NoError(t, err)
	echo, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	start := time.Now()
	_, _, _, err = rtPost(s.Client(), s.URL+"/payments", "echo-1", payBody)
	took := time.Since(start)
	t.Logf("admin: %d %s; the payment's answer was lost after %v (%v)", resp.StatusCode, echo, took.Round(time.Millisecond), err)
	require.False(t, resp.StatusCode == http.StatusCreated && strings.Contains(string(echo), `"delay_ms":3000`) && took < 3*time.Second,
		"the fault was taken and echoed with delay_ms 3000, and ran without any delay")
}
