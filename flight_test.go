package idem

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
)

type outcome struct {
	resp *Response
	err  error
}

// heldLeader starts, inside a synctest bubble, a leader of the flight
// for key "k" that holds the key until open is called, then ends with
// what result returns, sent on leader. It returns once the leader holds
// the key; the test's end opens it, so that a failed assertion does not
// leave the leader blocked.
func heldLeader(t *testing.T, f *flights, result func() (*Response, error)) (leader <-chan outcome, open func()) {
	t.Helper()
	release := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)
	out := make(chan outcome, 1)
	go func() {
		resp, err := f.do(t.Context(), "k", func() (*Response, error) {
			<-release
			return result()
		})
		out <- outcome{resp, err}
	}()
	synctest.Wait() // the leader holds the key
	return out, open
}

// TestFlight keeps the calls that share one intent's flight: each caller
// keeps its own context and its own copy of the answer.
func TestFlight(t *testing.T) {

	// A waiter whose own context expires returns at once with an unknown
	// outcome (a *RetryError), not a bare context error, while the call it
	// waited for goes on.
	t.Run("a waiter whose context expires gets an unknown outcome", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var f flights
			leader, open := heldLeader(t, &f, func() (*Response, error) {
				return &Response{StatusCode: http.StatusCreated}, nil
			})

			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			_, err := f.do(ctx, "k", func() (*Response, error) {
				t.Error("the waiter must not send while the leader holds the key")
				return nil, nil
			})
			var retryErr *RetryError
			require.ErrorAs(t, err, &retryErr)
			assert.ErrorIs(t, err, ErrOutcomeUnknown)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Equal(t, stopDeadline, retryErr.Reason)
			assert.Equal(t, "k", retryErr.Key)

			open()
			got := <-leader
			require.NoError(t, got.err)
			assert.Equal(t, http.StatusCreated, got.resp.StatusCode)
		})
	})

	// When the leader's caller cancels, a waiter whose context is alive does
	// not get the leader's context.Canceled: it takes the call over.
	t.Run("a waiter with time left takes over from a cancelled leader", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var f flights
			leaderCtx, cancelLeader := context.WithCancel(t.Context())
			defer cancelLeader()
			leader := make(chan outcome, 1)
			go func() {
				resp, err := f.do(leaderCtx, "k", func() (*Response, error) {
					<-leaderCtx.Done()
					return nil, &RetryError{Key: "k", Reason: stopCanceled, Attempts: 1, Err: leaderCtx.Err()}
				})
				leader <- outcome{resp, err}
			}()
			synctest.Wait() // the leader holds the key

			waiter := make(chan outcome, 1)
			go func() {
				resp, err := f.do(t.Context(), "k", func() (*Response, error) {
					return &Response{StatusCode: http.StatusCreated}, nil
				})
				waiter <- outcome{resp, err}
			}()
			synctest.Wait() // the waiter waits for the leader
			cancelLeader()

			got := <-leader
			assert.ErrorIs(t, got.err, context.Canceled, "the leader's caller cancelled")
			got = <-waiter
			require.NoError(t, got.err, "the waiter's context is alive")
			assert.Equal(t, http.StatusCreated, got.resp.StatusCode)
		})
	})

	// A leader that ends because its own deadline left no time for the next
	// attempt does not end the calls of waiters with more time either.
	t.Run("a waiter outlives a leader with a short deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var f flights
			leader, open := heldLeader(t, &f, func() (*Response, error) {
				return nil, &RetryError{Key: "k", Reason: stopDeadline, Attempts: 1, Wait: time.Minute}
			})
			waiter := make(chan outcome, 1)
			go func() {
				resp, err := f.do(t.Context(), "k", func() (*Response, error) {
					return &Response{StatusCode: http.StatusCreated}, nil
				})
				waiter <- outcome{resp, err}
			}()
			synctest.Wait()
			open()

			got := <-leader
			var retryErr *RetryError
			require.True(t, errors.As(got.err, &retryErr))
			got = <-waiter
			require.NoError(t, got.err)
			assert.Equal(t, http.StatusCreated, got.resp.StatusCode)
		})
	})

	// Waiters on one flight get copies of their own: no two callers share a
	// body or a header map.
	t.Run("waiters get their own copy", func(t *testing.T) {
		t.Parallel()
		var f flights
		release := make(chan struct{})
		started := make(chan struct{})
		resps := make([]*Response, 3)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			resps[0], _ = f.do(context.Background(), "k", func() (*Response, error) {
				close(started)
				<-release
				return &Response{StatusCode: 201, Header: http.Header{"A": {"1"}}, Body: []byte("{}")}, nil
			})
		}()
		<-started
		for i := 1; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resps[i], _ = f.do(context.Background(), "k", func() (*Response, error) { panic("a waiter ran the call") })
			}()
		}
		waitForWaiters(t, &f, "k", 2, nil)
		close(release)
		wg.Wait()
		for i, r := range resps {
			require.NotNil(t, r)
			r.Body[0] = byte('a' + i)
			r.Header.Set("A", string(rune('a'+i)))
		}
		for i, r := range resps {
			assert.Equal(t, byte('a'+i), r.Body[0], "caller %d", i)
			assert.Equal(t, string(rune('a'+i)), r.Header.Get("A"), "caller %d", i)
		}
	})

	// Two round trips for one intent share one flight, as two Do calls do.
	t.Run("two round trips for one intent share it", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
		h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
		arrived := make(chan struct{}, 4)
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				arrived <- struct{}{}
				<-release
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		t.Cleanup(open)

		c, err := NewWith(WithClock(clk), WithHTTPClient(srv.Client()))
		require.NoError(t, err)
		req, err := JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 5, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)
		hc := &http.Client{Transport: c.RoundTripper(srv.Client().Transport)}
		ctx := ContextWithIntent(context.Background(), in)

		codes := make([]int, 2)
		var wg sync.WaitGroup
		send := func(i int) {
			defer wg.Done()
			r, err := http.NewRequestWithContext(ctx, http.MethodPost, req.URL, strings.NewReader(string(req.Body)))
			if !assert.NoError(t, err) {
				return
			}
			resp, err := hc.Do(r)
			if assert.NoError(t, err) {
				resp.Body.Close()
				codes[i] = resp.StatusCode
			}
		}
		wg.Add(1)
		go send(0)
		<-arrived
		wg.Add(1)
		go send(1)
		waitForWaiters(t, c.flights, in.Key(), 1, arrived)
		open()
		wg.Wait()
		assert.Equal(t, []int{201, 201}, codes)
		assert.Equal(t, 1, h.Stats().Requests)
	})
}

// waitForWaiters yields until n callers wait on the flight for key.
func waitForWaiters(t *testing.T, f *flights, key string, n int, stray <-chan struct{}) bool {
	t.Helper()
	for {
		select {
		case <-stray:
			t.Errorf("a second request for key %s went on the wire", key)
			return false
		default:
		}
		f.mu.Lock()
		cur := f.m[key]
		ok := cur != nil && cur.waiters == n
		f.mu.Unlock()
		if ok {
			return true
		}
		runtime.Gosched()
	}
}
