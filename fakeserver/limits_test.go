package fakeserver_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

// lookup is the reconcile lookup a client makes for key.
func lookup(t *testing.T, s *fakeserver.Server, key string) answer {
	t.Helper()
	return send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=" + key, NoKey: true})
}

// TestMaxRecordsRefusesNewKeysAndStoresNothing: at the record cap a new key
// is answered 503 (a client retries it as an unknown outcome) with
// Retry-After until the earliest record expires; nothing is charged or
// stored, so the lookup says "never done", and the key works once a record
// has expired.
func TestMaxRecordsRefusesNewKeysAndStoresNothing(t *testing.T) {
	skipOnPostgres(t)
	t.Parallel()
	s, clk := newServer(t, &fakeserver.Options{MaxRecords: 2, Retention: time.Hour})
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	require.Equal(t, http.StatusCreated, pay(t, s, "k2", payBody).Status)

	clk.Advance(10 * time.Minute)
	a := pay(t, s, "k3", payBody)
	assert.Equal(t, http.StatusServiceUnavailable, a.Status)
	assert.Equal(t, fakeserver.ProblemStorageFull, a.problem(t).Type)
	assert.Equal(t, "3000", a.Header.Get("Retry-After"), "50 minutes until k1's record expires")
	st := s.Stats()
	assert.Equal(t, 2, st.Records)
	assert.Equal(t, 2, st.Payments)
	assert.Equal(t, 2, st.ProviderCharges)
	assert.Equal(t, 2, st.Executions)
	assert.Equal(t, http.StatusNotFound, lookup(t, s, "k3").Status, "never done")
	assert.Equal(t, "true", pay(t, s, "k1", payBody).Header.Get("Idempotent-Replayed"), "held keys still replay")

	clk.Advance(50 * time.Minute)
	assert.Equal(t, http.StatusCreated, pay(t, s, "k3", payBody).Status)
	assert.Equal(t, 1, s.Stats().Records, "the expired records made room")
}

// TestMaxPaymentsRefusesBeforeCharging: at the payment cap a new payment is
// answered 503 before the provider is called; its record is released, so a
// retry finds the key unused and the lookup says "never done". A declined
// card takes no room, and Reset makes room.
func TestMaxPaymentsRefusesBeforeCharging(t *testing.T) {
	skipOnPostgres(t)
	t.Parallel()
	s, _ := newServer(t, &fakeserver.Options{MaxPayments: 2})
	require.Equal(t, http.StatusPaymentRequired, pay(t, s, "k0", declineBody).Status)
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	require.Equal(t, http.StatusCreated, pay(t, s, "k2", payBody).Status)

	for range 2 {
		a := pay(t, s, "k3", payBody)
		assert.Equal(t, http.StatusServiceUnavailable, a.Status)
		assert.Equal(t, fakeserver.ProblemStorageFull, a.problem(t).Type)
	}
	st := s.Stats()
	assert.Equal(t, 2, st.Payments)
	assert.Equal(t, 2, st.ProviderCharges, "nothing charged")
	assert.Equal(t, 3, st.Records, "k0, k1 and k2; no record for k3")
	assert.Equal(t, http.StatusNotFound, lookup(t, s, "k3").Status, "never done")
	assert.Equal(t, "true", pay(t, s, "k1", payBody).Header.Get("Idempotent-Replayed"))

	fakeserver.Reset(s.Handler)
	assert.Equal(t, http.StatusCreated, pay(t, s, "k3", payBody).Status)
}

// TestMaxPaymentsKeepsRoomForADeadWorker: a worker that charged the
// provider and died holds its payment's room, so that the takeover records
// the charge even when the cap is reached meanwhile; once its record is
// gone unfinished, the sweep records the charge in that room: it is a
// payment, which the lookup must find.
func TestMaxPaymentsKeepsRoomForADeadWorker(t *testing.T) {
	skipOnPostgres(t)
	t.Parallel()
	s, clk := newServer(t, &fakeserver.Options{MaxPayments: 1, Retention: time.Hour})
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k1"}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, pay(t, s, "k2", payBody).Status, "k1's dead worker holds the room")

	clk.Advance(fakeserverLease)
	assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	st := s.Stats()
	assert.Equal(t, 1, st.Payments)
	assert.Equal(t, 1, st.ProviderCharges)

	t.Run("abandoned", func(t *testing.T) {
		s, clk := newServer(t, &fakeserver.Options{MaxPayments: 1, Retention: time.Hour})
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k1"}))
		_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
		require.Error(t, err)
		clk.Advance(time.Hour)
		assert.Equal(t, 1, s.Sweep())
		assert.Equal(t, http.StatusOK, lookup(t, s, "k1").Status, "the sweep recorded the charge")
		assert.Equal(t, http.StatusServiceUnavailable, pay(t, s, "k2", payBody).Status, "the charge holds the room")
	})
}

// TestMaxOrdersRefusesNewOrders: at the order cap a status for a new order
// is answered 503 and changes nothing, while known orders can still be
// updated; a status is at most MaxStatusLen characters.
func TestMaxOrdersRefusesNewOrders(t *testing.T) {
	skipOnPostgres(t)
	t.Parallel()
	s, _ := newServer(t, &fakeserver.Options{MaxOrders: 1})
	put := func(id, status string) answer {
		return send(t, s.Client(), s.URL, req{Method: http.MethodPut, Path: "/orders/" + id + "/status", NoKey: true,
			Body: `{"status":"` + status + `"}`})
	}
	require.Equal(t, http.StatusOK, put("1", "PAID").Status)
	a := put("2", "PAID")
	assert.Equal(t, http.StatusServiceUnavailable, a.Status)
	assert.Equal(t, fakeserver.ProblemStorageFull, a.problem(t).Type)
	assert.Equal(t, http.StatusOK, put("1", "SHIPPED").Status, "a known order is updated")

	long := put("1", strings.Repeat("S", fakeserver.MaxStatusLen+1))
	assert.Equal(t, http.StatusBadRequest, long.Status)
	assert.Equal(t, fakeserver.ProblemValidationFailed, long.problem(t).Type)
	fakeserver.Reset(s.Handler)
	assert.Equal(t, http.StatusOK, put("2", "PAID").Status)
}
