package fakeserver_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/fault"
)

// TestErrorFaultOnATakeoverNeverFreesTheKey (held): the error fault says
// NothingDone, which would free the key and give the next request a new
// stable id; after crash_after_provider the provider holds a charge for
// the old one. Path: crash_after_provider on K; the lease ends; the
// takeover of K meets an error fault (500); a status rule on the lookup;
// then the resend. The middleware keeps a takeover's record, so the resend
// takes it over with the same stable id: one charge, one payment.
func TestErrorFaultOnATakeoverNeverFreesTheKey(t *testing.T) {
	clk := clock.NewManual(epoch)
	s := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(s.Close)
	const key = "takeover-error-1"
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: key}))
	_, _, _, err := rtPost(s.Client(), s.URL+"/payments", key, payBody)
	require.Error(t, err)
	clk.Advance(31 * time.Second)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError, Key: key}))
	st, _, _, err := rtPost(s.Client(), s.URL+"/payments", key, payBody)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, st)

	require.NoError(t, s.InjectRule(&fault.Rule{When: fault.Query("idempotency_key"), Times: 1,
		Effect: fault.Effect{Kind: fakeserver.FaultStatus, Status: http.StatusNotFound}}))
	r, _ := http.NewRequest(http.MethodGet, s.URL+"/payments?idempotency_key="+key, nil)
	r.Header.Set("Authorization", "Bearer test_acme_1")
	resp, err := s.Client().Do(r)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Idempotency-Key"), "a proxy's 404 carries no echo")

	st, _, _, err = rtPost(s.Client(), s.URL+"/payments", key, payBody)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, st)
	stats := s.Stats()
	require.Equal(t, 1, stats.ProviderCharges)
	require.Equal(t, 1, stats.Payments)
}
