package fakeserver_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

func TestAdminStats(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	a := send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/_fake/stats", NoKey: true})
	require.Equal(t, http.StatusOK, a.Status)
	assert.JSONEq(t, `{"payments":1,"provider_charges":1,"executions":1,"records":1,"in_progress":0,"requests":1}`, string(a.Body))
}

func TestAdminFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		body   string
		status int
		echo   string // the fault as echoed, or a fragment of the problem detail
	}{
		{"minimal", `{"fault":"error"}`, 201, `{"fault":"error","count":1}`},
		{"all fields", `{"fault":"status","key":"\"k1\"","path":"/payments","count":2,"status":503,"retry_after":"Wed, 21 Oct 2026 07:28:00 GMT"}`, 201,
			`{"fault":"status","key":"k1","path":"/payments","count":2,"status":503,"retry_after":"Wed, 21 Oct 2026 07:28:00 GMT"}`},
		{"retry_after a number", `{"fault":"status","status":429,"retry_after":3}`, 201, `{"fault":"status","count":1,"status":429,"retry_after":"3"}`},
		{"delay", `{"fault":"delay","delay_ms":250}`, 201, `{"fault":"delay","count":1,"delay_ms":250}`},
		{"unknown fault", `{"fault":"explode"}`, 400, "valid faults: drop_response, delay, crash_after_insert, crash_after_provider, error, status, reset"},
		{"fault missing", `{}`, 400, `"fault" is required`},
		{"retry_after on another fault", `{"fault":"error","retry_after":2}`, 400, "retry_after is only for the status fault"},
		{"wrong type", `{"fault":"error","count":"two"}`, 400, `"count" must be an integer`},
		{"malformed JSON", `{"fault":`, 400, "cut short"},
		{"unknown field", `{"fault":"error","when":"now"}`, 400, `unknown field "when"`},
		{"negative delay", `{"fault":"delay","delay_ms":-1}`, 400, "delay_ms"},
		{"huge delay", `{"fault":"delay","delay_ms":9223372036854775807}`, 400, "delay_ms"},
		{"retry_after a fraction", `{"fault":"status","status":503,"retry_after":1.5}`, 400, "retry_after"},
		{"retry_after an object", `{"fault":"status","status":503,"retry_after":{}}`, 400, "retry_after"},
		{"status missing", `{"fault":"status"}`, 400, "200 to 599"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newServer(t, nil)
			a := send(t, s.Client(), s.URL, req{Path: "/_fake/faults", NoKey: true, Body: tt.body})
			require.Equal(t, tt.status, a.Status, "%s", a.Body)
			if tt.status == 201 {
				assert.JSONEq(t, tt.echo, string(a.Body))
				return
			}
			p := a.problem(t)
			assert.Equal(t, fakeserver.ProblemValidationFailed, p.Type)
			assert.Contains(t, p.Detail, tt.echo)
		})
	}
	// A query, an escaped path or an admin path never matches a request.
	t.Run("a fault that can never strike is refused", func(t *testing.T) {
		t.Parallel()
		s := fakeserver.NewServer(nil)
		t.Cleanup(s.Close)
		for _, path := range []string{"/payments?idempotency_key=k-1", "/pay%6Dents", "/_fake/stats"} {
			resp, err := s.Client().Post(s.URL+"/_fake/faults", "application/json",
				strings.NewReader(`{"fault":"error","path":"`+path+`"}`))
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "path %q, which no faulted request can have, was taken: %s", path, body)
			assert.Contains(t, string(body), "path", "the problem says what to give instead")
		}
	})
	// A delay on a fault that never waits is refused.
	t.Run("the echo is what the fault does", func(t *testing.T) {
		t.Parallel()
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
	})
}

func TestAdminFaultApplies(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	c := s.Client()
	a := send(t, c, s.URL, req{Path: "/_fake/faults", NoKey: true, Body: `{"fault":"status","status":503,"retry_after":2,"count":2}`})
	require.Equal(t, http.StatusCreated, a.Status)
	b := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusServiceUnavailable, b.Status)
	assert.Equal(t, "2", b.Header.Get("Retry-After"))

	// Admin endpoints are never faulted.
	assert.Equal(t, http.StatusOK, send(t, c, s.URL, req{Method: http.MethodGet, Path: "/_fake/stats", NoKey: true}).Status)

	d := send(t, c, s.URL, req{Method: http.MethodDelete, Path: "/_fake/faults", NoKey: true})
	assert.Equal(t, http.StatusNoContent, d.Status)
	assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
}

func TestAdminSweepAndReset(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, nil)
	c := s.Client()
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	clk.Advance(24 * 60 * 60 * 1e9)
	a := send(t, c, s.URL, req{Path: "/_fake/sweep", NoKey: true})
	require.Equal(t, http.StatusOK, a.Status)
	var swept struct{ Deleted int }
	require.NoError(t, json.Unmarshal(a.Body, &swept))
	assert.Equal(t, 1, swept.Deleted)
	assert.Zero(t, s.Stats().Records)

	r := send(t, c, s.URL, req{Path: "/_fake/reset", NoKey: true})
	assert.Equal(t, http.StatusNoContent, r.Status)
	assert.Equal(t, fakeserver.Stats{}, s.Stats())

	wrong := send(t, c, s.URL, req{Method: http.MethodGet, Path: "/_fake/reset", NoKey: true})
	assert.Equal(t, http.StatusMethodNotAllowed, wrong.Status)
}

func TestAdminFaultCaller(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	t.Run("a fault names its caller, and the echo shows a test token's account only", func(t *testing.T) {
		a := send(t, s.Client(), s.URL, req{Path: "/_fake/faults", NoKey: true,
			Body: `{"fault":"reset","key":"k1","caller":"Bearer test_acme_7"}`})
		require.Equal(t, http.StatusCreated, a.Status, "%s", a.Body)
		assert.Contains(t, string(a.Body), `"caller":"Bearer test_acme"`)
		a = send(t, s.Client(), s.URL, req{Path: "/_fake/faults", NoKey: true,
			Body: `{"fault":"reset","key":"k2","caller":"Bearer sk_live_secret"}`})
		require.Equal(t, http.StatusCreated, a.Status, "%s", a.Body)
		assert.NotContains(t, string(a.Body), "sk_live_secret")
		_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Auth: "Bearer test_globex_1", Body: payBody})
		require.NoError(t, err, "acme's fault struck globex")
		_, err = trySend(freshClient(t), s.URL, req{Key: "k1", Auth: "Bearer test_acme_1", Body: payBody})
		require.Error(t, err, "acme's fault missed acme")
	})
}
