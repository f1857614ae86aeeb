package fakeserver_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/pgtest"
)

// One test per row of the contract's section 4 table, in its order.

func TestRowKeyMissing(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	a := send(t, s.Client(), s.URL, req{NoKey: true, Body: payBody})
	assert.Equal(t, http.StatusBadRequest, a.Status)
	assert.Equal(t, fakeserver.ProblemBase+"idempotency-key-missing", a.problem(t).Type)
	assert.Equal(t, fakeserver.Stats{Requests: 1}, s.Stats())
}

func TestRowKeyMalformed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, key string
		uuid      bool
	}{
		{"empty", "", false},
		{"empty sf-string", `""`, false},
		{"too long", strings.Repeat("k", 256), false},
		{"too long quoted", `"` + strings.Repeat("k", 256) + `"`, false},
		{"space inside", "a b", false},
		{"non-ASCII", "ключ", false},
		{"control char", "a\x01b", false},
		{"unterminated sf-string", `"abc`, false},
		{"sf-string with space", `"a b"`, false},
		{"not a UUID in UUID mode", "order-1", true},
		{"UUID without hyphens in UUID mode", "8e03978e40d543e8bc936894a57f9324", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newServer(t, &fakeserver.Options{RequireUUID: tt.uuid})
			a, err := trySend(s.Client(), s.URL, req{Key: tt.key, Body: payBody})
			if err != nil { // net/http refuses to send some header values at all
				assert.ErrorContains(t, err, "invalid header field value")
				return
			}
			assert.Equal(t, http.StatusBadRequest, a.Status)
			p := a.problem(t)
			assert.Equal(t, fakeserver.ProblemKeyInvalid, p.Type)
			assert.NotEmpty(t, p.Detail)
			assert.Equal(t, fakeserver.Stats{Requests: 1}, s.Stats())
		})
	}
}

func TestKeyHeaderTwiceIsInvalid(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	hr, err := http.NewRequest(http.MethodPost, s.URL+"/payments", strings.NewReader(payBody))
	require.NoError(t, err)
	hr.Header.Add("Idempotency-Key", "a")
	hr.Header.Add("Idempotency-Key", "b")
	resp, err := s.Client().Do(hr)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Zero(t, s.Stats().Records)
}

func TestKeyFormats(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, first, second string
		uuid                bool
	}{
		{"bare then quoted", "order-1", `"order-1"`, false},
		{"quoted then bare", `"order-1"`, "order-1", false},
		{"sf-string with escaped quote", `"a\"b"`, `a"b`, false},
		{"sf-string with parameters", `"k";v=1`, "k", false},
		{"UUID mode", "8e03978e-40d5-43e8-bc93-6894a57f9324", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, true},
		{"255 characters", strings.Repeat("k", 255), strings.Repeat("k", 255), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newServer(t, &fakeserver.Options{RequireUUID: tt.uuid})
			first := pay(t, s, tt.first, payBody)
			require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
			second := pay(t, s, tt.second, payBody)
			assert.Equal(t, http.StatusCreated, second.Status)
			assert.Equal(t, "true", second.Header.Get("Idempotent-Replayed"), "the two forms must be one key")
			assert.Equal(t, 1, s.Stats().Executions)
		})
	}
}

// TestOneKeyOneRecord: in UUID mode a key is one key whatever the case of
// its hex digits (an iOS client sends UUID().uuidString in upper case, and
// a gateway may lower it on the retry), on either storage; in any-key mode
// keys are compared byte for byte. Every answer echoes the key as its
// request sent it.
func TestOneKeyOneRecord(t *testing.T) {
	t.Parallel()
	const upper, lower = "8E03978E-40D5-43E8-BC93-6894A57F9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"
	oneKey := func(t *testing.T, s *fakeserver.Server) {
		first := pay(t, s, upper, payBody)
		require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
		assert.Empty(t, first.Header.Get("Idempotent-Replayed"))
		assert.Equal(t, upper, first.Header.Get("Idempotency-Key"), "the echo is the key as received")
		retry := pay(t, s, lower, payBody)
		require.Equal(t, http.StatusCreated, retry.Status, "%s", retry.Body)
		assert.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"), "the lower-case retry replays")
		assert.Equal(t, lower, retry.Header.Get("Idempotency-Key"), "the echo is the key as received")
		assert.Equal(t, string(first.Body), string(retry.Body))
		st := s.Stats()
		assert.Equal(t, 1, st.Executions, "one execution")
		assert.Equal(t, 1, st.ProviderCharges, "one charge")
		assert.Equal(t, 1, st.Payments)
		for _, k := range []string{upper, lower} {
			found := send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=" + k, NoKey: true})
			assert.Equal(t, http.StatusOK, found.Status, "the lookup by %s finds the payment: %s", k, found.Body)
		}
	}
	t.Run("in UUID mode an upper-case key and its lower-case retry are one payment in memory", func(t *testing.T) {
		t.Parallel()
		oneKey(t, start(t, &fakeserver.Options{RequireUUID: true, Clock: clock.NewManual(epoch)}))
	})
	t.Run("in UUID mode an upper-case key and its lower-case retry are one payment on PostgreSQL", func(t *testing.T) {
		t.Parallel()
		oneKey(t, start(t, &fakeserver.Options{RequireUUID: true, Clock: clock.NewManual(epoch), Storage: onPostgres(newPool(t))}))
	})
	t.Run("in any-key mode keys that differ in case are two keys", func(t *testing.T) {
		t.Parallel()
		s, _ := newServer(t, nil)
		first := pay(t, s, upper, payBody)
		second := pay(t, s, lower, payBody)
		for _, a := range []answer{first, second} {
			assert.Equal(t, http.StatusCreated, a.Status, "%s", a.Body)
			assert.Empty(t, a.Header.Get("Idempotent-Replayed"))
		}
		assert.Equal(t, lower, second.Header.Get("Idempotency-Key"))
		assert.Equal(t, 2, s.Stats().Payments)
	})
}

// TestACompressedRetryIsTheSamePayment: a client compresses its payment
// with gzip, and its retry compresses it again a few seconds later, with
// another time in the gzip header: the retry replays the payment, with no
// second charge, where the bytes alone would be a 422.
func TestACompressedRetryIsTheSamePayment(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	var answers []answer
	for i, mod := range []time.Time{epoch, epoch.Add(4 * time.Second)} {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.ModTime = mod
		_, err := zw.Write([]byte(payBody))
		require.NoError(t, err)
		require.NoError(t, zw.Close())
		r, err := http.NewRequest(http.MethodPost, s.URL+"/payments", &buf)
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", "gz-1")
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Content-Encoding", "gzip")
		resp, err := s.Client().Do(r)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "attempt %d: %s", i+1, body)
		answers = append(answers, answer{Status: resp.StatusCode, Header: resp.Header, Body: body})
	}
	assert.Equal(t, "true", answers[1].Header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(answers[0].Body), string(answers[1].Body))
	st := s.Stats()
	assert.Equal(t, 1, st.Executions)
	assert.Equal(t, 1, st.ProviderCharges)
}

// validationCases are bodies that fail validation; FuzzHandler is seeded
// with them too.
var validationCases = []struct{ name, body, detail string }{
	{"empty", ``, "empty"},
	{"not JSON", `amount=1500`, "malformed JSON"},
	{"cut short", `{"amount":1500`, "cut short"},
	{"array", `[1,2]`, "JSON object"},
	{"amount zero", `{"amount":0,"currency":"AZN","customer":"cus_1"}`, `"amount" must be greater than 0`},
	{"amount negative", `{"amount":-5,"currency":"AZN","customer":"cus_1"}`, `"amount" must be greater than 0`},
	{"amount missing", `{"currency":"AZN","customer":"cus_1"}`, `"amount" is required`},
	{"amount a string", `{"amount":"1500","currency":"AZN","customer":"cus_1"}`, `"amount" must be an integer`},
	{"amount a fraction", `{"amount":15.5,"currency":"AZN","customer":"cus_1"}`, `"amount" must be an integer`},
	{"amount too big", `{"amount":1e40,"currency":"AZN","customer":"cus_1"}`, `"amount" must be an integer`},
	{"currency four letters", `{"amount":1,"currency":"AZNX","customer":"cus_1"}`, `"currency" must be three letters`},
	{"currency a number", `{"amount":1,"currency":944,"customer":"cus_1"}`, `"currency" must be a string`},
	{"customer missing", `{"amount":1,"currency":"AZN"}`, `"customer" is required`},
	{"customer too long", `{"amount":1,"currency":"AZN","customer":"` + strings.Repeat("c", 256) + `"}`, `"customer" must be at most 255 characters`},
	{"description too long", `{"amount":1,"currency":"AZN","customer":"c","description":"` + strings.Repeat("ş", 1001) + `"}`, `"description" must be at most 1000 characters`},
	{"unknown field", `{"amount":1,"currency":"AZN","customer":"c","tip":5}`, `unknown field "tip"`},
	{"trailing data", `{"amount":1,"currency":"AZN","customer":"c"} {}`, "data after"},
}

func TestRowValidationFailsStoresNothing(t *testing.T) {
	t.Parallel()
	for _, tt := range validationCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newServer(t, nil)
			a := pay(t, s, "k1", tt.body)
			assert.Equal(t, http.StatusBadRequest, a.Status)
			p := a.problem(t)
			assert.Equal(t, fakeserver.ProblemValidationFailed, p.Type)
			assert.Contains(t, p.Detail, tt.detail)
			assert.Equal(t, fakeserver.Stats{Requests: 1}, s.Stats())
			// The key stays free.
			assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
		})
	}
}

// TestRowBodyWithoutOneReadingStoresNothing: encoding/json matches member
// names case-insensitively and keeps the last, so these two bodies are
// payments of 2000 and 1500. Under one key they must not be one payment
// replayed for the other: each is refused, and nothing is stored.
func TestRowBodyWithoutOneReadingStoresNothing(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	for _, body := range []string{
		`{"amount":1500,"AMOUNT":2000,"currency":"AZN","customer":"cus_1"}`,
		`{"AMOUNT":2000,"amount":1500,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":1500,"currency":"AZN","customer":"cus_1","cuſtomer":"cus_2"}`,
		`{"amount":1500,"currency":"AZN","customer":"cus_1","description":` + strings.Repeat(`[`, 101) + strings.Repeat(`]`, 101) + `}`,
	} {
		a := pay(t, s, "k1", body)
		assert.Equal(t, http.StatusBadRequest, a.Status, body)
		assert.Equal(t, fakeserver.ProblemBase+"bad-request", a.problem(t).Type, body)
	}
	st := s.Stats()
	assert.Zero(t, st.Records)
	assert.Zero(t, st.Payments)
	assert.Zero(t, st.Executions)
	assert.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status, "the key stays free")
}

func TestValidationRunsBeforeRecordCheck(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	a := pay(t, s, "k1", `{"amount":0,"currency":"AZN","customer":"cus_1"}`)
	assert.Equal(t, http.StatusBadRequest, a.Status, "an invalid body is a 400 even when its key has a record")
	assert.Equal(t, fakeserver.ProblemValidationFailed, a.problem(t).Type)
	assert.Equal(t, 1, s.Stats().Records)
}

func TestRowKeyReused(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	first := pay(t, s, "k1", payBody)
	require.Equal(t, http.StatusCreated, first.Status)
	a := pay(t, s, "k1", otherBody)
	assert.Equal(t, http.StatusUnprocessableEntity, a.Status)
	assert.Equal(t, fakeserver.ProblemBase+"idempotency-key-reused", a.problem(t).Type)
	// Another query with the same key and body is reuse too.
	b := send(t, s.Client(), s.URL, req{Path: "/payments?x=1", Key: "k1", Body: payBody})
	assert.Equal(t, http.StatusUnprocessableEntity, b.Status, "the query is part of the fingerprint")
	st := s.Stats()
	assert.Equal(t, 1, st.Executions)
	assert.Equal(t, 1, st.Payments)
	assert.Equal(t, 1, st.Records)
	// The record is unchanged: the original body still replays.
	again := pay(t, s, "k1", payBody)
	assert.Equal(t, first.Body, again.Body)
}

func TestRowCompletedReplaysByteForByte(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	first := pay(t, s, "k1", payBody)
	require.Equal(t, http.StatusCreated, first.Status)
	assert.Empty(t, first.Header.Values("Idempotent-Replayed"), "a fresh answer never carries the replay header")

	// The same object serialised differently is the same request.
	reordered := `{ "description" : "coffee", "customer":"cus_1",
		"currency":"AZN", "amount":1500 }`
	for _, body := range []string{payBody, reordered} {
		again := pay(t, s, "k1", body)
		assert.Equal(t, first.Status, again.Status)
		assert.Equal(t, first.Body, again.Body)
		assert.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
		assert.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
		assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	}
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, Requests: 3}, s.Stats())
}

func TestRowInProgressConflict(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		delay      time.Duration
		advance    time.Duration
		retryAfter string
	}{
		{"no processing time", 0, 0, "1"},
		{"processing time left", 10 * time.Second, 0, "10"},
		{"rounded up", 10 * time.Second, 3500 * time.Millisecond, "7"},
		{"at least 1", 10 * time.Second, 9900 * time.Millisecond, "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, clk := newServer(t, &fakeserver.Options{ProcessingDelay: tt.delay, Lease: 30 * time.Second})
			// A worker that died after the insert leaves the record in
			// progress with a live lease, and never waits.
			require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert}))
			_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
			require.Error(t, err)
			clk.Advance(tt.advance)

			a := pay(t, s, "k1", payBody)
			assert.Equal(t, http.StatusConflict, a.Status)
			assert.Equal(t, fakeserver.ProblemRequestInProgress, a.problem(t).Type)
			assert.Equal(t, tt.retryAfter, a.Header.Get("Retry-After"))
			assert.Equal(t, fakeserver.Stats{Records: 1, InProgress: 1, Requests: 2}, s.Stats())
		})
	}
}

func TestRowLeaseExpiredTakeover(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, &fakeserver.Options{Lease: 10 * time.Second})
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert}))
	_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
	require.Error(t, err)

	clk.Advance(10*time.Second - time.Millisecond)
	require.Equal(t, http.StatusConflict, pay(t, s, "k1", payBody).Status, "the lease is still alive")
	clk.Advance(time.Millisecond)
	a := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusCreated, a.Status)
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, Requests: 3}, s.Stats())
	again := pay(t, s, "k1", payBody)
	assert.Equal(t, a.Body, again.Body)
}

func TestRowRetention(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, &fakeserver.Options{Retention: time.Hour})
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)

	clk.Advance(time.Hour - time.Second)
	assert.Equal(t, http.StatusUnprocessableEntity, pay(t, s, "k1", otherBody).Status, "the record is still retained")
	assert.Zero(t, s.Sweep())

	clk.Advance(time.Second)
	a := pay(t, s, "k1", otherBody)
	assert.Equal(t, http.StatusCreated, a.Status, "after retention the key is new again")
	assert.Empty(t, a.Header.Get("Idempotent-Replayed"))
	st := s.Stats()
	assert.Equal(t, 2, st.Payments)
	assert.Equal(t, 2, st.ProviderCharges)
	assert.Equal(t, 1, st.Records, "the expired record was replaced")
}

func TestSweepDeletesExpiredRecords(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, &fakeserver.Options{Retention: time.Hour})
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	clk.Advance(30 * time.Minute)
	require.Equal(t, http.StatusCreated, pay(t, s, "k2", payBody).Status)
	require.Equal(t, 2, s.Stats().Records)

	clk.Advance(30 * time.Minute)
	assert.Equal(t, 1, s.Sweep())
	assert.Equal(t, 1, s.Stats().Records)
	clk.Advance(30 * time.Minute)
	assert.Equal(t, 1, s.Sweep())
	assert.Zero(t, s.Stats().Records)
	assert.Equal(t, 2, s.Stats().Payments, "sweeping records keeps payments")
}

func TestRowNoRecordCreates(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	a := pay(t, s, "k1", payBody)
	require.Equal(t, http.StatusCreated, a.Status)
	assert.Equal(t, "application/json", a.Header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(a.Body, &p))
	assert.Equal(t, "/payments/"+p["id"].(string), a.Header.Get("Location"))
	assert.Equal(t, map[string]any{"id": p["id"], "amount": 1500.0, "currency": "AZN", "customer": "cus_1",
		"description": "coffee", "status": "succeeded", "created_at": "2026-03-01T12:00:00Z"}, p)
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 1, Records: 1, Requests: 1}, s.Stats())
}

func TestDeclineIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	first := pay(t, s, "k1", declineBody)
	require.Equal(t, http.StatusPaymentRequired, first.Status)
	assert.Equal(t, fakeserver.ProblemCardDeclined, first.problem(t).Type)
	again := pay(t, s, "k1", declineBody)
	assert.Equal(t, http.StatusPaymentRequired, again.Status)
	assert.Equal(t, first.Body, again.Body)
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, fakeserver.Stats{Executions: 1, Records: 1, Requests: 2}, s.Stats())
}

func TestServerErrorIsNeverStored(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError}))
	a := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusInternalServerError, a.Status)
	assert.Equal(t, fakeserver.ProblemInjectedFault, a.problem(t).Type)
	assert.Equal(t, fakeserver.Stats{Executions: 1, Requests: 1}, s.Stats(), "rolled back, key released")

	b := pay(t, s, "k1", payBody)
	assert.Equal(t, http.StatusCreated, b.Status, "a retry does the work")
	assert.Empty(t, b.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, fakeserver.Stats{Payments: 1, ProviderCharges: 1, Executions: 2, Records: 1, Requests: 2}, s.Stats())
}

func TestCallersAreScoped(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	c := s.Client()
	alice := send(t, c, s.URL, req{Key: "k1", Auth: "Bearer alice", Body: payBody})
	bob := send(t, c, s.URL, req{Key: "k1", Auth: "Bearer bob", Body: otherBody})
	anon := send(t, c, s.URL, req{Key: "k1", Body: otherBody})
	for _, a := range []answer{alice, bob, anon} {
		assert.Equal(t, http.StatusCreated, a.Status)
		assert.Empty(t, a.Header.Get("Idempotent-Replayed"))
	}
	assert.Equal(t, 3, s.Stats().Payments)

	loc := alice.Header.Get("Location")
	assert.Equal(t, http.StatusOK, send(t, c, s.URL, req{Method: http.MethodGet, Path: loc, Auth: "Bearer alice", NoKey: true}).Status)
	assert.Equal(t, http.StatusNotFound, send(t, c, s.URL, req{Method: http.MethodGet, Path: loc, Auth: "Bearer bob", NoKey: true}).Status)
}

// TestATestTokenNamesItsAccount: tokens that name one account are one
// caller, so a retry with a refreshed token replays and the lookup and
// reads find the payment; another account, or a token that names none,
// is another caller.
func TestATestTokenNamesItsAccount(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	c := s.Client()
	first := send(t, c, s.URL, req{Key: "k1", Auth: "Bearer test_acme_token-1", Body: payBody})
	require.Equal(t, http.StatusCreated, first.Status)
	for _, auth := range []string{"Bearer test_acme_token-2", "bearer test_acme", "Bearer  test_acme_x_y"} {
		retry := send(t, c, s.URL, req{Key: "k1", Auth: auth, Body: payBody})
		assert.Equal(t, http.StatusCreated, retry.Status, auth)
		assert.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"), "%s is acme: the retry replays", auth)
		assert.Equal(t, string(first.Body), string(retry.Body))
	}
	assert.Equal(t, 1, s.Stats().ProviderCharges, "one charge across the refreshes")

	refreshed := "Bearer test_acme_token-3"
	assert.Equal(t, http.StatusOK, send(t, c, s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=k1", Auth: refreshed, NoKey: true}).Status)
	assert.Equal(t, http.StatusOK, send(t, c, s.URL, req{Method: http.MethodGet, Path: first.Header.Get("Location"), Auth: refreshed, NoKey: true}).Status)

	for _, auth := range []string{"Bearer test_globex_1", "Bearer ci-1", "Bearer ci-2", "Bearer test_", "Bearer test_a!b_1", "Basic test_acme_1", ""} {
		other := send(t, c, s.URL, req{Key: "k1", Auth: auth, Body: payBody})
		assert.Equal(t, http.StatusCreated, other.Status, auth)
		assert.Empty(t, other.Header.Get("Idempotent-Replayed"), "%q is not acme: its own payment", auth)
		assert.Equal(t, http.StatusNotFound, send(t, c, s.URL, req{Method: http.MethodGet, Path: first.Header.Get("Location"), Auth: auth, NoKey: true}).Status)
	}
	assert.Equal(t, 8, s.Stats().ProviderCharges)
}

func TestAccountOfTestTokens(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		auth, account string
		ok            bool
	}{
		{"Bearer test_acme_1", "acme", true},
		{"Bearer test_acme", "acme", true},
		{"BEARER test_acme_a_b", "acme", true},
		{"Bearer test_acme-eu.2_x", "acme-eu.2", true},
		{"Bearer test__x", "", false},
		{"Bearer test_" + strings.Repeat("a", fakeserver.MaxAccountLen+1), "", false},
		{"Bearer test_" + strings.Repeat("a", fakeserver.MaxAccountLen), strings.Repeat("a", fakeserver.MaxAccountLen), true},
		{"Bearer sk_live_1", "", false},
		{"Token test_acme_1", "", false},
		{"Bearertest_acme_1", "", false},
		{"", "", false},
	} {
		account, ok := fakeserver.AccountOf(c.auth)
		assert.Equal(t, c.ok, ok, c.auth)
		assert.Equal(t, c.account, account, c.auth)
	}
}

func TestReadEndpoints(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	c := s.Client()
	created := send(t, c, s.URL, req{Key: "k1", Auth: "a", Body: payBody})
	require.Equal(t, http.StatusCreated, created.Status)
	require.Equal(t, http.StatusCreated, send(t, c, s.URL, req{Key: "k2", Auth: "a", Body: otherBody}).Status)

	tests := []struct {
		name, path, key string
		status          int
		body            string
	}{
		{"by id", created.Header.Get("Location"), "", http.StatusOK, string(created.Body)},
		{"by key", "/payments?idempotency_key=k1", "", http.StatusOK, string(created.Body)},
		{"by quoted key", `/payments?idempotency_key="k1"`, "", http.StatusOK, string(created.Body)},
		{"unknown key", "/payments?idempotency_key=k9", "", http.StatusNotFound, ""},
		{"invalid key", "/payments?idempotency_key=", "", http.StatusBadRequest, ""},
		{"unknown id", "/payments/pay_nope", "", http.StatusNotFound, ""},
		{"a key on GET is ignored", created.Header.Get("Location"), "ignored", http.StatusOK, string(created.Body)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := send(t, c, s.URL, req{Method: http.MethodGet, Path: tt.path, Auth: "a", Key: tt.key, NoKey: tt.key == ""})
			assert.Equal(t, tt.status, a.Status)
			if tt.body != "" {
				assert.Equal(t, tt.body, string(a.Body))
			}
		})
	}

	list := send(t, c, s.URL, req{Method: http.MethodGet, Auth: "a", NoKey: true})
	require.Equal(t, http.StatusOK, list.Status)
	var l struct{ Data []map[string]any }
	require.NoError(t, json.Unmarshal(list.Body, &l))
	assert.Len(t, l.Data, 2)
	assert.Equal(t, 2, s.Stats().Executions, "reads do no work")
}

func TestOrderStatusIgnoresKey(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	c := s.Client()
	for _, key := range []string{"", "k1", "k1", "bad key"} {
		a := send(t, c, s.URL, req{Method: http.MethodPut, Path: "/orders/15/status", Key: key, NoKey: key == "", Body: `{"status":"SHIPPED"}`})
		assert.Equal(t, http.StatusOK, a.Status)
		assert.JSONEq(t, `{"id":"15","status":"SHIPPED"}`, string(a.Body))
		assert.Empty(t, a.Header.Get("Idempotent-Replayed"))
	}
	bad := send(t, c, s.URL, req{Method: http.MethodPut, Path: "/orders/15/status", NoKey: true, Body: `{"status":7}`})
	assert.Equal(t, http.StatusBadRequest, bad.Status)
	assert.Zero(t, s.Stats().Records)
}

// TestOrderStatusRefusesTextThePostgreSQLStateCannotHold: a status or an
// order id holding U+0000, which PostgreSQL's text cannot hold, is a 400
// that changes nothing, in memory and on PostgreSQL alike, not a 500 on
// PostgreSQL.
func TestOrderStatusRefusesTextThePostgreSQLStateCannotHold(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"in memory", "on PostgreSQL"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			opts := &fakeserver.Options{Clock: clock.NewManual(epoch)}
			if where == "on PostgreSQL" {
				opts.Storage = onPostgres(newPool(t))
			}
			s := start(t, opts)
			for _, r := range []req{
				{Method: http.MethodPut, Path: "/orders/15/status", NoKey: true, Body: `{"status":"SHIP\u0000PED"}`},
				{Method: http.MethodPut, Path: "/orders/1%005/status", NoKey: true, Body: `{"status":"SHIPPED"}`},
			} {
				a := send(t, s.Client(), s.URL, r)
				require.Equal(t, http.StatusBadRequest, a.Status, "%s %s", r.Path, a.Body)
				assert.Equal(t, fakeserver.ProblemValidationFailed, a.problem(t).Type)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	c := s.Client()
	big := `{"amount":1,"currency":"AZN","customer":"c","description":"` + strings.Repeat("x", 1<<20) + `"}`
	tests := []struct {
		name   string
		r      req
		status int
		typ    string
	}{
		{"body over 1 MiB", req{Key: "k1", Body: big}, http.StatusRequestEntityTooLarge, fakeserver.ProblemPayloadTooLarge},
		{"order body over 1 MiB", req{Method: http.MethodPut, Path: "/orders/1/status", NoKey: true, Body: big}, http.StatusRequestEntityTooLarge, fakeserver.ProblemPayloadTooLarge},
		{"unknown path", req{Path: "/nope", NoKey: true}, http.StatusNotFound, fakeserver.ProblemBase + "not-found"},
		{"wrong method", req{Method: http.MethodDelete, NoKey: true}, http.StatusMethodNotAllowed, fakeserver.ProblemBase + "method-not-allowed"},
		{"POST on a payment", req{Path: "/payments/x", Key: "k"}, http.StatusMethodNotAllowed, fakeserver.ProblemBase + "method-not-allowed"},
		{"nested path", req{Method: http.MethodGet, Path: "/payments/x/y", NoKey: true}, http.StatusNotFound, fakeserver.ProblemBase + "not-found"},
		{"unknown admin path", req{Method: http.MethodGet, Path: "/_fake/nope", NoKey: true}, http.StatusNotFound, fakeserver.ProblemBase + "not-found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := send(t, c, s.URL, tt.r)
			assert.Equal(t, tt.status, a.Status)
			assert.Equal(t, tt.typ, a.problem(t).Type)
		})
	}
	assert.Zero(t, s.Stats().Records)
}

func TestBackgroundSweep(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, &fakeserver.Options{Retention: time.Hour, SweepEvery: time.Millisecond})
	require.Equal(t, http.StatusCreated, pay(t, s, "k1", payBody).Status)
	clk.Advance(time.Hour)
	assert.Eventually(t, func() bool { return s.Stats().Records == 0 }, 10*time.Second, time.Millisecond)
}

// TestDatabaseErrorsAreLoggedNeverShown: on PostgreSQL, with the payments
// table gone, the payment's commit and the list fail; both answers are 500
// problems that say nothing internal, and the database's message is logged.
func TestDatabaseErrorsAreLoggedNeverShown(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	var logged syncBuffer
	s, _ := newServer(t, &fakeserver.Options{Storage: onPostgres(pool), Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	_, err := pool.Exec(context.Background(), "DROP TABLE fake_payments")
	require.NoError(t, err)

	for _, a := range []answer{
		pay(t, s, "k1", payBody),
		send(t, s.Client(), s.URL, req{Method: http.MethodGet, NoKey: true}),
		send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=k2", NoKey: true}),
	} {
		assert.Equal(t, http.StatusInternalServerError, a.Status)
		assert.Equal(t, fakeserver.ProblemInternal, a.problem(t).Type)
		for _, internal := range []string{"SQLSTATE", "fake_payments", "relation", "does not exist", "ERROR", "fakeserver:", "pgstore"} {
			assert.NotContains(t, string(a.Body), internal)
		}
	}
	assert.Contains(t, logged.String(), "SQLSTATE 42P01", "the database's message is logged")
}

// syncBuffer is a bytes.Buffer for a logger shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLookupMarksItsAnswers: every answer of the lookup echoes the key of
// its query as received and forbids caching, and its miss is a problem of
// its own type, distinct from the 404 of a path the API does not have.
func TestLookupMarksItsAnswers(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, nil)
	c := s.Client()
	require.Equal(t, http.StatusCreated, send(t, c, s.URL, req{Key: "k1", Auth: "a", Body: payBody}).Status)

	tests := []struct {
		name, path, echo string
		status           int
		typ              string
	}{
		{"found", "/payments?idempotency_key=k1", "k1", http.StatusOK, ""},
		{"found by quoted key", `/payments?idempotency_key="k1"`, `"k1"`, http.StatusOK, ""},
		{"nothing done under the key", "/payments?idempotency_key=k9", "k9", http.StatusNotFound, fakeserver.ProblemKeyUnused},
		{"another caller's key is unused for this one", "/payments?idempotency_key=k1", "k1", http.StatusNotFound, fakeserver.ProblemKeyUnused},
		{"invalid key", "/payments?idempotency_key=", "", http.StatusBadRequest, fakeserver.ProblemKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auth := "a"
			if strings.HasPrefix(tt.name, "another caller") {
				auth = "b"
			}
			a := send(t, c, s.URL, req{Method: http.MethodGet, Path: tt.path, Auth: auth, NoKey: true})
			require.Equal(t, tt.status, a.Status, "body: %s", a.Body)
			assert.Equal(t, []string{tt.echo}, a.Header.Values("Idempotency-Key"))
			assert.Equal(t, "no-store", a.Header.Get("Cache-Control"))
			if tt.typ != "" {
				assert.Equal(t, tt.typ, a.problem(t).Type)
			}
		})
	}
	t.Run("a path the API does not have is not the typed miss", func(t *testing.T) {
		a := send(t, c, s.URL, req{Method: http.MethodGet, Path: "/payments/pay_nope", Auth: "a", NoKey: true})
		require.Equal(t, http.StatusNotFound, a.Status)
		assert.NotEqual(t, fakeserver.ProblemKeyUnused, a.problem(t).Type)
		assert.Empty(t, a.Header.Values("Idempotency-Key"))
	})
}

// TestRowValidationRefusesTextThePostgreSQLStateCannotHold: PostgreSQL's
// text cannot hold U+0000, which JSON can spell. A payment whose customer
// or description holds it must be a 400 before the key is used, in memory
// and on PostgreSQL alike, not a 500 on every retry (a client retries 5xx
// until it gives up with an unknown outcome) whose detail is the
// database's own error text.
func TestRowValidationRefusesTextThePostgreSQLStateCannotHold(t *testing.T) {
	t.Parallel()
	bodies := []string{
		`{"amount":1500,"currency":"AZN","customer":"cus_\u0000","description":"coffee"}`,
		`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"cof\u0000fee"}`,
	}
	for _, where := range []string{"in memory", "on PostgreSQL"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			var s *fakeserver.Server
			if where == "in memory" {
				s = start(t, &fakeserver.Options{Clock: clock.NewManual(epoch)})
			} else {
				ps, _ := processes(t, 1, time.Hour)
				s = ps[0]
			}
			for i, body := range bodies {
				key := "k" + strconv.Itoa(i)
				a := pay(t, s, key, body)
				require.Equal(t, http.StatusBadRequest, a.Status, "%s", a.Body)
				assert.Equal(t, fakeserver.ProblemValidationFailed, a.problem(t).Type)
				assert.NotContains(t, string(a.Body), "SQLSTATE", "a problem never carries the database's text")
				assert.Equal(t, http.StatusNotFound, lookup(t, s, key).Status, "nothing was done")
			}
			st := s.Stats()
			assert.Zero(t, st.Records, "the keys stay free")
			assert.Zero(t, st.ProviderCharges)
		})
	}
}

// TestServerErrorsNeverCarryTheDatabasesText: a 500 says the server
// failed and that a retry with the key is safe; it never carries the
// database's error text (table names, SQLSTATEs), whichever table fails:
// the provider's, the intents' or the middleware's records.
func TestServerErrorsNeverCarryTheDatabasesText(t *testing.T) {
	t.Parallel()
	for _, table := range []string{"fake_charges", "fake_intents", "idempotency_records"} {
		t.Run(table, func(t *testing.T) {
			t.Parallel()
			pool := newPool(t)
			s := start(t, &fakeserver.Options{Storage: onPostgres(pool), Clock: clock.NewManual(epoch)})
			_, err := pool.Exec(context.Background(), "DROP TABLE "+table)
			require.NoError(t, err)
			for _, a := range []answer{pay(t, s, "k1", payBody), lookup(t, s, "k1")} {
				require.Equal(t, http.StatusInternalServerError, a.Status, "%s", a.Body)
				assert.Equal(t, fakeserver.ProblemInternal, a.problem(t).Type)
				assert.NotContains(t, string(a.Body), table)
				assert.NotContains(t, string(a.Body), "SQLSTATE")
			}
		})
	}
}

// TestRowRetentionNeverEndsUnderALiveLease: a takeover just before the
// record's retention ends gets a lease that outlasts it. A record must not
// expire under its live worker: while the worker that took it over still
// runs, a resend finds the record in progress (409), not the key new, and
// is never charged again under a new stable id, in memory and on
// PostgreSQL.
func TestRowRetentionNeverEndsUnderALiveLease(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"in memory", "on PostgreSQL"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			opts := &fakeserver.Options{Retention: time.Hour}
			if where == "on PostgreSQL" {
				opts.Storage = onPostgres(newPool(t))
			} else {
				opts.MaxRecords = 100 // newServer keeps it in memory
			}
			s, clk := newServer(t, opts)
			require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert, Key: "k1"}))
			_, err := trySend(freshClient(t), s.URL, req{Key: "k1", Body: payBody})
			require.Error(t, err, "the first worker died")
			clk.Advance(time.Hour - time.Second)

			// The takeover runs for a second of real time, past the retention.
			require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDelay, Key: "k1", Delay: time.Second}))
			done := make(chan answer, 1)
			go func() { done <- pay(t, s, "k1", payBody) }()
			// The takeover holds a new lease once it has the record.
			require.Eventually(t, func() bool { return fakeserver.LeaseUntil(s.Handler, "k1").After(clk.Now()) },
				10*time.Second, 5*time.Millisecond)
			clk.Advance(2 * time.Second)
			resend := pay(t, s, "k1", payBody)
			assert.Equal(t, http.StatusConflict, resend.Status, "the resend under the live lease: %s", resend.Body)
			assert.Equal(t, http.StatusConflict, lookup(t, s, "k1").Status, "the lookup under the live lease")
			assert.Equal(t, 0, s.Sweep(), "the sweep leaves the record under its live lease")
			taken := <-done
			assert.Equal(t, http.StatusCreated, taken.Status, "the takeover: %s", taken.Body)

			st := s.Stats()
			assert.Equal(t, 1, st.ProviderCharges, "one key, one charge")
			assert.Equal(t, st.ProviderCharges, st.Payments, "every charge is a payment")
			assert.Equal(t, http.StatusOK, lookup(t, s, "k1").Status, "the lookup answers the payment")
		})
	}
}

// TestALongCredentialPays: a 3,000-character token, and one near the
// program's 16 KiB header limit, pay (201) and replay, in memory and on
// PostgreSQL, where the caller is kept as a digest that fits the index.
func TestALongCredentialPays(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"memory", "postgres"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			opts := &fakeserver.Options{}
			if where == "postgres" {
				opts.Storage = onPostgres(newPool(t))
			}
			s, _ := newServer(t, opts)
			for i, n := range []int{3000, 15 << 10} {
				auth := "Bearer sk_live_" + pgtest.RandomToken(n)
				key := []string{"k-3000", "k-15k"}[i]
				first := send(t, s.Client(), s.URL, req{Key: key, Auth: auth, Body: payBody})
				require.Equal(t, http.StatusCreated, first.Status, "%d characters: %s", n, first.Body)
				again := send(t, s.Client(), s.URL, req{Key: key, Auth: auth, Body: payBody})
				assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
				assert.Equal(t, http.StatusOK, send(t, s.Client(), s.URL, req{Method: http.MethodGet, Path: "/payments?idempotency_key=" + key, Auth: auth, NoKey: true}).Status)
			}
			assert.Equal(t, 2, s.Stats().ProviderCharges)
		})
	}
}
