package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDelayFaultHoldsTheWorkAsDocumented (held): docs/FAKESERVER.md says the
// delay fault "holds the work delay_ms before committing", and that only
// an answer held past -write-timeout is lost. Path: the program with
// -read-timeout 2s and -write-timeout 20s; POST /_fake/faults
// {"fault":"delay","delay_ms":3000}; a payment. net/http's read deadline
// (-read-timeout, "the whole request, body included") also ends the
// request's context while the handler sleeps, so at 2s the fake gives up
// the payment and answers 503 "Client went away ... nothing was charged"
// to a client that is still there: the delay fault, documented as a slow
// server that does the work, is a refusal once it outlasts -read-timeout
// (30s by default, under the 1m -write-timeout the docs name).
func TestDelayFaultHoldsTheWorkAsDocumented(t *testing.T) {
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
}
