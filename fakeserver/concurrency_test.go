package fakeserver_test

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

// The seed's closing test: many copies of one request at once do the work
// once.
func TestSameKeyAtOnce(t *testing.T) {
	t.Parallel()
	const n = 100
	s, _ := newServer(t, &fakeserver.Options{ProcessingDelay: 50 * time.Millisecond})
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}

	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = send(t, c, s.URL, req{Key: "same", Body: payBody})
		})
	}
	close(start)
	wg.Wait()

	var created []byte
	conflicts := 0
	for _, a := range answers {
		switch a.Status {
		case http.StatusCreated:
			if created == nil {
				created = a.Body
			}
			assert.Equal(t, created, a.Body, "every 201 is the original")
		case http.StatusConflict:
			conflicts++
			secs, err := strconv.Atoi(a.Header.Get("Retry-After"))
			if assert.NoError(t, err) {
				assert.GreaterOrEqual(t, secs, 1)
			}
		default:
			t.Errorf("unexpected answer %d: %s", a.Status, a.Body)
		}
	}
	require.NotNil(t, created)
	st := s.Stats()
	assert.Equal(t, 1, st.Executions)
	assert.Equal(t, 1, st.ProviderCharges)
	assert.Equal(t, 1, st.Payments)
	assert.Equal(t, n, st.Requests)
	t.Logf("%d conflicts, %d created or replayed", conflicts, n-conflicts)
}

// Many keys and callers at once, with takeovers racing for dead workers.
func TestManyKeysAtOnce(t *testing.T) {
	t.Parallel()
	s, clk := newServer(t, nil)
	const keys = 20
	for i := range keys {
		require.NoError(t, s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k" + strconv.Itoa(i)}))
	}
	fc := freshClient(t)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() { _, _ = trySend(fc, s.URL, req{Key: "k" + strconv.Itoa(i), Body: payBody}) })
	}
	wg.Wait()
	require.Equal(t, keys, s.Stats().InProgress)
	clk.Advance(fakeserverLease)

	for i := range keys {
		for range 5 {
			wg.Go(func() {
				a := pay(t, s, "k"+strconv.Itoa(i), payBody)
				assert.Contains(t, []int{http.StatusCreated, http.StatusConflict}, a.Status)
			})
		}
	}
	wg.Wait()
	st := s.Stats()
	assert.Equal(t, keys, st.ProviderCharges)
	assert.Equal(t, keys, st.Payments)
	assert.Equal(t, 2*keys, st.Executions, "one crash and one takeover per key")
	assert.Zero(t, st.InProgress)
}
