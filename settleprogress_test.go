package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
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

// TestSettleProgress keeps what SettleAll tells of its progress, and what
// the callback may do.
func TestSettleProgress(t *testing.T) {
	t.Parallel()

	// SettleAll settles at most WithSettleConcurrency intents at once, and as
	// many as that while enough are left; it reports each as it ends, one at a
	// time, done counting up to the total. The bound is checked without
	// timing: in a synctest bubble, once every goroutine is blocked, the
	// requests held by the server are all the settles under way.
	t.Run("SettleAll bounds its concurrency and reports each intent", func(t *testing.T) {
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
					c, err := idem.NewWith(idem.WithStore(store), idem.WithClock(clk),
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
						assert.Equal(t, persist.StateSucceeded, s.Intent.State())
						assert.True(t, slices.ContainsFunc(reports, func(p idem.Settled) bool {
							return p.Intent == s.Intent && p.Response == s.Response && p.Err == nil
						}), "each result reported once, as SettleAll returns it")
					}
				})
			})
		}
	})

	// Here, those the context ended before their settle began.
	t.Run("intents SettleAll does not send are reported too", func(t *testing.T) {
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
	})

	// A progress callback that panics does not take the process down from a
	// goroutine of SettleAll, where the app could not recover it: SettleAll
	// calls it no more, settles every intent all the same, and then panics
	// with the callback's value on the app's own goroutine.
	t.Run("a panic of the callback reaches the caller", func(t *testing.T) {
		t.Parallel()
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					const n = 5
					store, clk := persist.NewMemory(nil), clock.NewManual(epoch)
					unresolved(t, store, clk, n)
					var calls atomic.Int32
					c := budgetClient(t, &server{answer: created}, clk, store,
						idem.WithSettleConcurrency(workers),
						idem.WithSettleProgress(func(idem.Settled, int, int) {
							calls.Add(1)
							panic("progress bar gone")
						}))
					var recovered any
					func() {
						defer func() { recovered = recover() }()
						_, _ = c.SettleAll(context.Background())
					}()
					assert.Equal(t, "progress bar gone", recovered)
					assert.Equal(t, int32(1), calls.Load(), "not called again after it panicked")
					synctest.Wait()
					left, err := c.Unresolved(context.Background())
					require.NoError(t, err)
					assert.Empty(t, left, "every settle went on")
				})
			})
		}
	})

	// The progress callback may call back into the Client (load the intent,
	// settle it again, list what is left) without a deadlock: synctest
	// reports one if every goroutine blocks.
	t.Run("the callback may call the Client", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			const n = 6
			store, clk := persist.NewMemory(nil), clock.NewManual(epoch)
			unresolved(t, store, clk, n)
			var (
				c     *idem.Client
				mu    sync.Mutex
				dones []int
			)
			ctx := context.Background()
			c = budgetClient(t, &server{answer: created}, clk, store,
				idem.WithSettleConcurrency(3),
				idem.WithSettleProgress(func(s idem.Settled, done, total int) {
					in, err := c.Load(ctx, s.Intent.Key())
					assert.NoError(t, err)
					assert.Equal(t, persist.StateSucceeded, in.State())
					resp, err := c.Settle(ctx, s.Intent)
					assert.NoError(t, err)
					assert.Equal(t, http.StatusCreated, resp.StatusCode)
					_, err = c.Unresolved(ctx)
					assert.NoError(t, err)
					mu.Lock()
					dones = append(dones, done)
					mu.Unlock()
				}))
			settled, err := c.SettleAll(ctx)
			require.NoError(t, err)
			require.Len(t, settled, n)
			assert.Equal(t, []int{1, 2, 3, 4, 5, 6}, dones)
		})
	})

	// SettleAll's progress counts what its result holds when the store errs:
	// the damaged record is in neither (SettleAll's error names it), the
	// intent whose outcome could not be saved is reported with its error,
	// each once, done running up to a total that is the result's length; and
	// with WithSettleConcurrency(math.MaxInt), as with 1.
	t.Run("it counts what the result holds when the store errs", func(t *testing.T) {
		t.Parallel()
		for _, workers := range []int{1, math.MaxInt} {
			t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					const n = 4
					mem, clk := persist.NewMemory(nil), clock.NewManual(epoch)
					unresolved(t, mem, clk, n)
					recs, err := mem.List(context.Background(), persist.Filter{Unresolved: true})
					require.NoError(t, err)
					store := &listDamagedStore{Store: mem, failKey: recs[1].Key}
					var (
						mu      sync.Mutex
						reports = map[string]int{}
						dones   []int
					)
					c := budgetClient(t, &server{answer: created}, clk, store,
						idem.WithSettleConcurrency(workers),
						idem.WithSettleProgress(func(s idem.Settled, done, total int) {
							mu.Lock()
							defer mu.Unlock()
							assert.Equal(t, n, total)
							reports[s.Intent.Key()]++
							dones = append(dones, done)
						}))
					settled, err := c.SettleAll(context.Background())
					var corrupt *persist.CorruptError
					require.ErrorAs(t, err, &corrupt)
					require.Len(t, settled, n)
					assert.Equal(t, []int{1, 2, 3, 4}, dones)
					for _, s := range settled {
						assert.Equal(t, 1, reports[s.Intent.Key()])
						if s.Intent.Key() == store.failKey {
							assert.ErrorIs(t, s.Err, errSaveFailed)
						} else {
							assert.NoError(t, s.Err)
						}
					}
				})
			})
		}
	})
}

// unresolved leaves n intents pending in store: the last run sent each
// once and lost the answer.
func unresolved(t *testing.T, store persist.Store, clk *clock.Manual, n int) {
	t.Helper()
	dead := &server{answer: refused}
	last := budgetClient(t, dead, clk, store, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	for i := range n {
		_, err := send(t, last, dead, i)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	}
}

// listDamagedStore is a memory store that reports a damaged record beside the
// readable ones when listed, and fails to save the record of one key.
type listDamagedStore struct {
	persist.Store
	failKey string
}

var errSaveFailed = errors.New("disk full")

func (s *listDamagedStore) List(ctx context.Context, f persist.Filter) ([]*persist.Record, error) {
	recs, err := s.Store.List(ctx, f)
	return recs, errors.Join(err, &persist.CorruptError{Key: "damaged", Err: errors.New("truncated")})
}

func (s *listDamagedStore) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec.Key == s.failKey {
		return errSaveFailed
	}
	return s.Store.Write(ctx, rec, old)
}
