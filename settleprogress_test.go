package idem_test

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// heldServer holds every request until the test lets it go, then answers
// it as the server's own 201.
type heldServer struct {
	mu      sync.Mutex
	held    int
	release chan struct{}
}

func (s *heldServer) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.held++
	s.mu.Unlock()
	<-s.release
	s.mu.Lock()
	s.held--
	s.mu.Unlock()
	return created(0, req)
}

func (s *heldServer) holding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// SettleAll settles at most WithSettleConcurrency intents at once, and as
// many as that while enough are left; it reports each as it ends, one at a
// time, done counting up to the total. The bound is checked without
// timing: in a synctest bubble, once every goroutine is blocked, the
// requests held by the server are all the settles under way.
func TestSettleAllBoundsConcurrencyAndReportsProgress(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 3, 4} {
		t.Run("", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 10
				store := persist.NewMemory(nil)
				clk := clock.NewManual(epoch)
				// The last run: one attempt each, the answers lost.
				dead := &server{answer: refused}
				last := budgetClient(t, dead, clk, store, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
				for i := range n {
					_, err := send(t, last, dead, i)
					require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				}

				srv := &heldServer{release: make(chan struct{})}
				var (
					mu      sync.Mutex
					reports []idem.Settled
					dones   []int
				)
				c, err := idem.New(idem.WithStore(store), idem.WithClock(clk),
					idem.WithHTTPClient(&http.Client{Transport: srv}),
					idem.WithSettleConcurrency(workers),
					idem.WithSettleProgress(func(s idem.Settled, done, total int) {
						mu.Lock()
						defer mu.Unlock()
						assert.Equal(t, n, total)
						reports = append(reports, s)
						dones = append(dones, done)
					}))
				require.NoError(t, err)
				type result struct {
					settled []idem.Settled
					err     error
				}
				out := make(chan result, 1)
				go func() {
					s, err := c.SettleAll(context.Background())
					out <- result{s, err}
				}()
				for released := 0; released < n; {
					synctest.Wait()
					held := srv.holding()
					require.Equal(t, min(workers, n-released), held, "settles under way with %d released", released)
					mu.Lock()
					assert.Len(t, reports, released, "each settle reported as it ended")
					mu.Unlock()
					for range held {
						srv.release <- struct{}{}
					}
					released += held
				}
				r := <-out
				require.NoError(t, r.err)
				require.Len(t, r.settled, n)
				assert.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, dones)
				for _, s := range r.settled {
					require.NoError(t, s.Err)
					assert.Equal(t, idem.StateSucceeded, s.Intent.State())
					assert.True(t, slices.ContainsFunc(reports, func(p idem.Settled) bool {
						return p.Intent == s.Intent && p.Response == s.Response && p.Err == nil
					}), "each result reported once, as SettleAll returns it")
				}
			})
		})
	}
}

// Intents SettleAll does not send are reported too: here those the
// context ended before their settle began.
func TestSettleAllReportsIntentsItDoesNotSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 6
	for i := range n {
		e.unknownOutcome(t, e.newIntent(t, "checkout:report-"+string(rune('a'+i)), 100), "drop_response")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu    sync.Mutex
		dones []int
	)
	// The app goes to the background as the first resend goes out.
	c := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: cancelOnRequest{cancel}}), idem.WithSettleProgress(func(s idem.Settled, done, total int) {
		mu.Lock()
		defer mu.Unlock()
		assert.ErrorIs(t, s.Err, context.Canceled)
		assert.Equal(t, n, total)
		dones = append(dones, done)
	}))
	settled, err := c.SettleAll(ctx)
	require.NoError(t, err)
	require.Len(t, settled, n)
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6}, dones)
}
