package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/long"
	"github.com/idemkit/idem/persist"
)

// server is a scripted server behind a transport: each request gets the
// answer of the function, which sees the request's number (1 for the
// first), and every request is counted. Nothing goes on a network.
type server struct {
	mu       sync.Mutex
	requests int
	answer   func(n int, req *http.Request) (*http.Response, error)
}

func (s *server) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.requests++
	n := s.requests
	s.mu.Unlock()
	if req.Body != nil {
		req.Body.Close()
	}
	return s.answer(n, req)
}

func (s *server) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// refused is a dead server: every connection refused.
func refused(int, *http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

// timedOut is a server that never answers in time.
func timedOut(int, *http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// answer is the server's own answer to req: status, with the key echoed.
func answer(req *http.Request, status int) *http.Response {
	return &http.Response{
		StatusCode: status,
		Header:     http.Header{"Idempotency-Key": {req.Header.Get("Idempotency-Key")}},
		Body:       io.NopCloser(strings.NewReader("{}")),
		Request:    req,
	}
}

func unavailable(_ int, req *http.Request) (*http.Response, error) {
	return answer(req, http.StatusServiceUnavailable), nil
}

func created(_ int, req *http.Request) (*http.Response, error) {
	return answer(req, http.StatusCreated), nil
}

// budgetClient is a Client on srv and a manual clock, with a memory store.
func budgetClient(t *testing.T, srv *server, clk clock.Clock, store persist.Store, opts ...idem.Option) *idem.Client {
	t.Helper()
	c, err := idem.NewWith(append([]idem.Option{
		idem.WithHTTPClient(&http.Client{Transport: srv}),
		idem.WithClock(clk),
		idem.WithStore(store),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 100, MaxElapsed: time.Hour, Jitter: -1}),
	}, opts...)...)
	require.NoError(t, err)
	return c
}

func payRequest(i int) idem.Request {
	return idem.Request{Method: http.MethodPost, URL: "https://api.example/payments", Body: fmt.Appendf(nil, `{"amount":%d}`, 100+i)}
}

// send sends a new intent for action i and returns how many requests it
// took and its error.
func send(t *testing.T, c *idem.Client, srv *server, i int) (int, error) {
	t.Helper()
	before := srv.count()
	_, err := c.Send(context.Background(), fmt.Sprintf("checkout:%d", i), payRequest(i))
	return srv.count() - before, err
}

// TestRetryBudget keeps the Client's bucket of retries: it bounds what a
// dead server gets, never what a lossy network needs, and only the
// server's word refills it.
func TestRetryBudget(t *testing.T) {
	t.Parallel()

	// The budget's arithmetic, on a manual clock that does not refill it: a
	// full bucket of 20 (the default once) pays four retries of 5 tokens, then calls stop at once
	// with StopRetryBudget, their outcome unknown; a first attempt still goes
	// out; final answers put tokens back.
	t.Run("it spends on retries and refunds on answers", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := &server{answer: unavailable}
		store := persist.NewMemory(nil)
		c := budgetClient(t, srv, clk, store, idem.WithRetryBudget(idem.RetryBudget{Tokens: 20, Refill: -1}))

		n, err := send(t, c, srv, 1)
		assert.Equal(t, 5, n, "a first attempt and four retries of 5 tokens from 20")
		requireStop(t, err, idem.StopRetryBudget)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Contains(t, err.Error(), "client-wide retry budget spent")
		in, err := c.Load(context.Background(), keyOf(t, err))
		require.NoError(t, err)
		assert.Equal(t, persist.StatePending, in.State(), "503s came back: the server may have done it")

		n, err = send(t, c, srv, 2)
		assert.Equal(t, 1, n, "an empty bucket: the first attempt only")
		requireStop(t, err, idem.StopRetryBudget)

		// Four answers to first attempts put back a token each: still less
		// than a retry.
		srv.answer = created
		for i := range 4 {
			n, err = send(t, c, srv, 10+i)
			require.NoError(t, err)
			assert.Equal(t, 1, n)
		}
		srv.answer = unavailable
		n, err = send(t, c, srv, 3)
		assert.Equal(t, 1, n, "4 tokens pay no retry")
		requireStop(t, err, idem.StopRetryBudget)
		srv.answer = created
		_, err = send(t, c, srv, 20)
		require.NoError(t, err)
		srv.answer = unavailable
		n, _ = send(t, c, srv, 4)
		assert.Equal(t, 2, n, "the fifth answer makes a retry's 5 tokens")

		// A retry that gets the final answer puts back what it took.
		srv.answer = created
		for i := range 15 {
			_, err = send(t, c, srv, 30+i)
			require.NoError(t, err)
		}
		// 15 tokens now. First attempt fails, the retry (5 tokens) gets the
		// answer and puts its 5 back.
		srv.answer = func(n int, req *http.Request) (*http.Response, error) {
			if n%2 == 1 {
				return unavailable(n, req)
			}
			return created(n, req)
		}
		srv.mu.Lock()
		srv.requests = 0
		srv.mu.Unlock()
		n, err = send(t, c, srv, 50)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		srv.answer = unavailable
		n, _ = send(t, c, srv, 51)
		assert.Equal(t, 4, n, "15 tokens, not 10: three retries")
	})

	// A retry after an attempt that timed out costs 10 tokens: two from a
	// bucket of 20.
	t.Run("a retry after a timeout costs more", func(t *testing.T) {
		t.Parallel()
		srv := &server{answer: timedOut}
		c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil), idem.WithRetryBudget(idem.RetryBudget{Tokens: 20, Refill: -1}))
		n, err := send(t, c, srv, 1)
		assert.Equal(t, 3, n)
		requireStop(t, err, idem.StopRetryBudget)
	})

	// Tokens come back with time on the Client's clock, one per Refill: an
	// empty bucket (of 20 here) pays a retry again five seconds later, and
	// waits refill it.
	t.Run("it refills with time on the Client's clock", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := &server{answer: unavailable}
		c := budgetClient(t, srv, clk, persist.NewMemory(nil), idem.WithRetryBudget(idem.RetryBudget{Tokens: 20}),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 100, MaxElapsed: time.Hour, InitialInterval: time.Millisecond, Multiplier: 1, Jitter: -1}))
		n, _ := send(t, c, srv, 1)
		assert.Equal(t, 5, n, "waits of 1ms refill nothing")
		clk.Advance(4 * time.Second)
		n, _ = send(t, c, srv, 2)
		assert.Equal(t, 1, n, "4s: 4 tokens")
		clk.Advance(time.Second)
		n, _ = send(t, c, srv, 3)
		assert.Equal(t, 2, n, "5s: a retry")
		clk.Advance(time.Hour)
		n, _ = send(t, c, srv, 4)
		assert.Equal(t, 5, n, "never more than 20")

		// Waits of 5s each refill a retry's cost as they pass: a call that
		// finds one retry's cost in the bucket runs until its own policy ends
		// it.
		clk.Advance(5 * time.Second)
		slow := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 30, InitialInterval: 5 * time.Second, Multiplier: 1})
		before := srv.count()
		_, err := c.Send(slow, "checkout:slow", payRequest(5))
		requireStop(t, err, idem.StopAttempts)
		assert.Equal(t, 30, srv.count()-before)
	})

	// The Client's clock set back a day (the user fixes a clock that ran
	// ahead) does not freeze the budget for that day: tokens come back from
	// the new time on. Set forward by years, the bucket fills, and no more.
	t.Run("it refills after the clock jumps", func(t *testing.T) {
		t.Parallel()
		truth := clock.NewManual(epoch)
		clk := newDeviceClock(truth)
		srv := &server{answer: unavailable}
		c := budgetClient(t, srv, clk, persist.NewMemory(nil), idem.WithRetryBudget(idem.RetryBudget{Tokens: 20}),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 100, MaxElapsed: time.Hour, InitialInterval: time.Millisecond, Multiplier: 1, Jitter: -1}))
		n, _ := send(t, c, srv, 1)
		require.Equal(t, 5, n, "the full bucket")
		clk.Jump(-24 * time.Hour)
		n, _ = send(t, c, srv, 2)
		assert.Equal(t, 1, n, "set back: nothing came back")
		truth.Advance(5 * time.Second)
		n, _ = send(t, c, srv, 3)
		assert.Equal(t, 2, n, "five seconds after the jump: a retry")
		clk.Jump(10 * 365 * 24 * time.Hour)
		n, _ = send(t, c, srv, 4)
		assert.Equal(t, 5, n, "ten years on: a full bucket, no more")
	})

	// RetryBudget{Tokens: -1} turns the budget off: each call's policy alone
	// bounds it.
	t.Run("a bucket of -1 tokens turns it off", func(t *testing.T) {
		t.Parallel()
		srv := &server{answer: unavailable}
		c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil),
			idem.WithRetryBudget(idem.RetryBudget{Tokens: -1}),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 40, MaxElapsed: 1000 * time.Hour, Jitter: -1}))
		for i := range 3 {
			n, err := send(t, c, srv, i)
			assert.Equal(t, 40, n)
			requireStop(t, err, idem.StopAttempts)
		}
	})

	// A bucket of math.MaxInt tokens, an app's "as good as no limit", stays
	// full: a final answer's refund to a full bucket, and a day's refill, do
	// not wrap it around to below a retry's cost.
	t.Run("a bucket of MaxInt tokens never wraps around", func(t *testing.T) {
		t.Parallel()
		for _, refill := range []time.Duration{-1, time.Nanosecond} {
			t.Run(fmt.Sprint("refill=", refill), func(t *testing.T) {
				clk := newDeviceClock(clock.NewManual(epoch))
				srv := &server{answer: created}
				c := budgetClient(t, srv, clk, persist.NewMemory(nil), idem.WithRetryBudget(idem.RetryBudget{Tokens: math.MaxInt, Refill: refill}))
				n, err := send(t, c, srv, 1)
				require.NoError(t, err)
				require.Equal(t, 1, n)
				srv.answer = unavailable
				_, _ = send(t, c, srv, 2) // takes tokens, then refills
				clk.Jump(24 * time.Hour)
				three := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxAttempts: 3})
				before := srv.count()
				_, err = c.Send(three, "checkout:3", payRequest(3))
				requireStop(t, err, idem.StopAttempts)
				assert.Equal(t, 3, srv.count()-before, "the budget pays every retry")
			})
		}
	})

	// New refuses a cost that the bucket can never pay, the default bucket of
	// 500 included: such a budget would end every call after its first
	// attempt.
	t.Run("New refuses a cost the bucket can never pay", func(t *testing.T) {
		t.Parallel()
		for _, b := range []idem.RetryBudget{
			{RetryCost: 501},
			{TimeoutCost: 501},
			{Tokens: 8},
			{Tokens: 30, TimeoutCost: 31},
		} {
			_, err := idem.NewWith(idem.WithRetryBudget(b))
			require.Error(t, err, "%+v", b)
			assert.Contains(t, err.Error(), "below a retry's cost", "%+v", b)
		}
		for _, b := range []idem.RetryBudget{
			{RetryCost: 500},
			{TimeoutCost: 500},
			{Tokens: 10},
			{Tokens: 3, RetryCost: 1, TimeoutCost: 3},
			{Tokens: -1, RetryCost: 100},
		} {
			_, err := idem.NewWith(idem.WithRetryBudget(b))
			assert.NoError(t, err, "%+v", b)
		}
	})

	// A call whose context ends in the wait before a retry made no retry: the
	// tokens it took for it come back. Four such calls leave a bucket of 20
	// full, not empty.
	t.Run("a retry the context canceled is refunded", func(t *testing.T) {
		t.Parallel()
		srv := &server{answer: unavailable}
		var cancel context.CancelFunc
		c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil),
			idem.WithRetryBudget(idem.RetryBudget{Tokens: 20, Refill: -1}),
			idem.WithAttemptHook(func(a idem.Attempt) {
				if a.Retry && cancel != nil {
					cancel() // the user gives up as the wait begins
				}
			}))
		for i := range 4 {
			var ctx context.Context
			ctx, cancel = context.WithCancel(context.Background())
			before := srv.count()
			_, err := c.Send(ctx, fmt.Sprintf("checkout:%d", i), payRequest(i))
			requireStop(t, err, idem.StopCanceled)
			require.Equal(t, 1, srv.count()-before)
		}
		cancel = nil
		n, err := send(t, c, srv, 9)
		requireStop(t, err, idem.StopRetryBudget)
		assert.Equal(t, 5, n, "a full bucket: four retries")
	})

	// Only the server's word puts tokens back: a gateway's unmarked 401 to
	// the first attempt of fresh intents (it never reached the server) ends
	// those calls with the outcome unknown, but says nothing of the server's
	// health, so a fleet whose gateway answers every new call cannot buy back
	// retries against a dead server with it. The server's own final answer
	// still refunds.
	t.Run("a stranger's answers never refill it", func(t *testing.T) {
		t.Parallel()
		const (
			dead = iota
			gateway
			declined
		)
		var mode atomic.Int32
		srv := &server{answer: func(n int, req *http.Request) (*http.Response, error) {
			switch mode.Load() {
			case gateway:
				return &http.Response{StatusCode: http.StatusUnauthorized, Header: http.Header{},
					Body: io.NopCloser(strings.NewReader("log in")), Request: req}, nil
			case declined:
				return answer(req, http.StatusPaymentRequired), nil
			}
			return unavailable(n, req)
		}}
		c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil),
			idem.WithRetryBudget(idem.RetryBudget{Tokens: 5, RetryCost: 5, TimeoutCost: 5, Refill: -1}))
		n, err := send(t, c, srv, 1)
		requireStop(t, err, idem.StopRetryBudget)
		require.Equal(t, 2, n, "the bucket pays one retry")

		mode.Store(gateway)
		for i := range 5 {
			n, err := send(t, c, srv, 10+i)
			requireStop(t, err, idem.StopUnmarked)
			require.Equal(t, 1, n)
		}
		mode.Store(dead)
		n, err = send(t, c, srv, 2)
		requireStop(t, err, idem.StopRetryBudget)
		assert.Equal(t, 1, n, "five gateway answers bought no retry")

		mode.Store(declined)
		for i := range 5 {
			_, err := send(t, c, srv, 20+i)
			var apiErr *idem.APIError
			require.ErrorAs(t, err, &apiErr)
		}
		mode.Store(dead)
		n, _ = send(t, c, srv, 3)
		assert.Equal(t, 2, n, "five answers of the server's own bought a retry")
	})

	// The budget that ends a call on a 409 (the server still at work on an
	// earlier attempt) leaves the intent pending, never not sent: the server
	// has the request.
	t.Run("an empty bucket on an in-flight answer leaves the payment pending", func(t *testing.T) {
		t.Parallel()
		srv := &server{answer: func(_ int, req *http.Request) (*http.Response, error) {
			resp := answer(req, http.StatusConflict)
			resp.Header.Set("Retry-After", "1")
			return resp, nil
		}}
		c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil),
			idem.WithRetryBudget(idem.RetryBudget{Tokens: 10, Refill: -1}))
		n, err := send(t, c, srv, 1)
		assert.Equal(t, 3, n)
		requireStop(t, err, idem.StopRetryBudget)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		in, err := c.Load(context.Background(), keyOf(t, err))
		require.NoError(t, err)
		assert.Equal(t, persist.StatePending, in.State())
		// Settle on the empty bucket: one attempt, still pending.
		before := srv.count()
		_, err = c.Settle(context.Background(), in)
		requireStop(t, err, idem.StopRetryBudget)
		assert.Equal(t, 1, srv.count()-before)
		assert.Equal(t, persist.StatePending, in.State())
	})

	// On the fake payments server: answers lost after the server charged
	// take the bucket to empty; the call ends pending (the server has the
	// payment), never not sent; a Settle on the empty bucket gets the
	// server's stored answer with its first attempt, and the customer is
	// charged once.
	t.Run("an empty bucket after lost answers charges once", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		c := e.newClient(t, idem.WithRetryBudget(idem.RetryBudget{Tokens: 10, RetryCost: 5, TimeoutCost: 10, Refill: -1}),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 20, MaxElapsed: time.Hour, Jitter: -1}))
		in, err := c.NewIntent(context.Background(), "checkout:lost", e.paymentRequest(t, 700, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key(), Count: 3})
		_, err = c.Do(context.Background(), in)
		requireStop(t, err, idem.StopRetryBudget)
		assert.Equal(t, persist.StatePending, in.State(), "the server charged: never not sent")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)

		resp, err := c.Settle(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, 1, resp.Attempts, "the empty bucket allows a first attempt")
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "charged once")
	})

	// One budget for every kind of call at once: Sends, requests through the
	// RoundTripper, a SettleAll and Settles, all against a server that is
	// down, make between them exactly the four retries that a full bucket of
	// 20 pays (no answer puts a token back, and the clock refills none). Run
	// with -race.
	t.Run("it is shared by every kind of call at once", func(t *testing.T) {
		t.Parallel()
		store, clk := persist.NewMemory(nil), clock.NewManual(epoch)
		dead := &server{answer: refused}
		last := budgetClient(t, dead, clk, store, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		var pending []string
		for i := range 6 {
			_, err := send(t, last, dead, 100+i)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			pending = append(pending, keyOf(t, err))
		}

		srv := &server{answer: unavailable}
		var retries, paid atomic.Int32
		c := budgetClient(t, srv, clk, store,
			idem.WithRetryBudget(idem.RetryBudget{Tokens: 20, Refill: -1}),
			idem.WithSettleConcurrency(3),
			idem.WithAttemptHook(func(a idem.Attempt) {
				if a.Number > 1 {
					retries.Add(1)
				}
				if a.Retry {
					paid.Add(1)
				}
			}))
		ctx := context.Background()
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				_, err := c.Send(ctx, fmt.Sprintf("checkout:%d", i), payRequest(i))
				assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			})
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodPost, "https://api.example/refunds", strings.NewReader(fmt.Sprint(i)))
				if !assert.NoError(t, err) {
					return
				}
				resp, err := (&http.Client{Transport: c.RoundTripper(srv)}).Do(req)
				if err == nil {
					resp.Body.Close()
				}
			})
		}
		wg.Go(func() {
			_, err := c.SettleAll(ctx)
			assert.NoError(t, err)
		})
		for _, key := range pending[:3] {
			wg.Go(func() {
				in, err := c.Load(ctx, key)
				if assert.NoError(t, err) {
					_, err = c.Settle(ctx, in)
					assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int32(4), paid.Load(), "retries paid for")
		assert.Equal(t, int32(4), retries.Load(), "retries made")
		for _, key := range pending {
			in, err := c.Load(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, persist.StatePending, in.State())
		}
	})

	// At app start, 12 intents left unresolved against a server that is down.
	// SettleAll under a 2-second background policy (three attempts each: at
	// 0, 0.5s and 1.5s) makes 36 attempts without a budget (37 in the field,
	// with jitter); with a bucket of 20, 16: the 12 first attempts and the
	// four retries of a full bucket, whose 3 seconds
	// of waits refill 3 tokens, less than a retry. The settles run one at a
	// time here, so that the clock's refill is the same on every run.
	t.Run("it bounds a dead server at app start", func(t *testing.T) {
		t.Parallel()
		attempts := func(t *testing.T, budget idem.RetryBudget) (int, []idem.Settled, time.Duration) {
			clk := clock.NewManual(epoch)
			store := persist.NewMemory(nil)
			srv := &server{answer: refused}
			// The last run: one attempt each, the answers lost.
			first := budgetClient(t, srv, clk, store, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
			for i := range 12 {
				_, err := send(t, first, srv, i)
				requireStop(t, err, idem.StopAttempts)
			}
			// App start.
			c := budgetClient(t, srv, clk, store, idem.WithRetryBudget(budget), idem.WithSettleConcurrency(1))
			before, start := srv.count(), clk.Now()
			background := idem.ContextWithRetryPolicy(context.Background(), idem.RetryPolicy{MaxElapsed: 2 * time.Second, MaxAttempts: 10, Jitter: -1})
			settled, err := c.SettleAll(background)
			require.NoError(t, err)
			require.Len(t, settled, 12)
			return srv.count() - before, settled, clk.Now().Sub(start)
		}
		without, settled, took := attempts(t, idem.RetryBudget{Tokens: -1})
		assert.Equal(t, 36, without)
		for _, s := range settled {
			requireStop(t, s.Err, idem.StopElapsed)
		}
		t.Logf("no budget: %d attempts, %s of waits", without, took)

		with, settled, took := attempts(t, idem.RetryBudget{Tokens: 20})
		t.Logf("a bucket of 20: %d attempts, %s of waits", with, took)
		assert.Equal(t, 12+4, with, "12 first attempts, 4 retries from the full bucket")
		assert.Equal(t, 3*time.Second, took, "two calls waited 0.5s and 1s")
		stopped := 0
		for _, s := range settled {
			var re *idem.RetryError
			require.True(t, errors.As(s.Err, &re))
			assert.Equal(t, persist.StatePending, s.Intent.State(), "the outcome stays unknown")
			if re.Reason == idem.StopRetryBudget {
				stopped++
			}
		}
		assert.Equal(t, 10, stopped, "the settles after the first two end on the empty bucket")
	})

	// A policy of 1ns waits and no end of attempts against a dead server: the
	// default budget keeps it to a full bucket's 100 retries (the waits of
	// 100ns refill nothing), then one retry per five seconds of the clock,
	// not a request loop.
	t.Run("it bounds a policy of nanosecond waits", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := &server{answer: unavailable}
		c := budgetClient(t, srv, clk, persist.NewMemory(nil),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: math.MaxInt, InitialInterval: time.Nanosecond, MaxInterval: time.Nanosecond, Multiplier: 1, Jitter: -1}))
		n, err := send(t, c, srv, 1)
		requireStop(t, err, idem.StopRetryBudget)
		assert.Equal(t, 101, n)
		clk.Advance(5 * time.Second)
		n, err = send(t, c, srv, 2)
		requireStop(t, err, idem.StopRetryBudget)
		assert.Equal(t, 2, n, "five seconds later: one retry")
	})

	// The defaults do not give up on a lossy network, and still bound what a
	// dead server gets (see RetryBudget for the argument and the numbers).
	// The clock is synctest's: the waits take no real time.
	t.Run("the defaults never give up on a lossy network and bound a dead server", func(t *testing.T) {
		t.Parallel()
		for _, loss := range []struct {
			name    string
			silence time.Duration
		}{
			{"closed connections", 0},
			{"timeouts of 10s", 10 * time.Second},
		} {
			t.Run("100 payments at once with 30% of answers lost as "+loss.name+" all end paid, each charged once", func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					errs, h, mn := payAtOnce(t, 1, 0.3, loss.silence, idem.RetryBudget{})
					for i, err := range errs {
						assert.NoError(t, err, "payment %d", i)
					}
					assert.Equal(t, 100, h.Stats().ProviderCharges)
					retries, _ := mn.counts(0, time.Hour)
					t.Logf("%d answers lost, %d retries", mn.lost, retries)
					assert.Equal(t, mn.lost, retries, "a retry for each lost answer, no more")
					assert.Greater(t, mn.lost, 30, "the seed loses at least the 30% it stands for")
				})
			})
		}
		// The bucket of 20 that the defaults replace: the same run ends
		// payments "budget spent", their outcome unknown.
		t.Run("a bucket of 20 leaves payments of the same run unknown", func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				errs, _, _ := payAtOnce(t, 1, 0.3, 0, idem.RetryBudget{Tokens: 20})
				spent := 0
				for _, err := range errs {
					var re *idem.RetryError
					if errors.As(err, &re) && re.Reason == idem.StopRetryBudget {
						spent++
					}
				}
				t.Logf("%d of 100 payments ended budget spent", spent)
				assert.Greater(t, spent, 10)
			})
		})

		// Against a dead server: 100 calls at once, then one new call a second
		// for five minutes (a queue draining, a user tapping), each with a
		// policy long enough that only the budget stops it. The 100 calls make
		// at most 212 attempts in the first minute (100 first attempts, 112
		// retries); after it, the Client retries at most once every five
		// seconds, however many calls ask, and keeps doing so.
		t.Run("a dead server gets at most 112 retries in the first minute and one per five seconds after it", func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				mn := newMemoryNet(nil)
				mn.dead = true
				c, err := idem.NewWith(
					idem.WithHTTPClient(&http.Client{Transport: mn}),
					idem.WithStore(persist.NewMemory(nil)),
					idem.WithLookup(contractLookup),
					idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1000, MaxElapsed: time.Hour}))
				require.NoError(t, err)
				var wg sync.WaitGroup
				call := func(i int) {
					wg.Go(func() {
						_, err := c.Send(context.Background(), fmt.Sprintf("invoice:%d", i), payRequest(i))
						assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
					})
				}
				for i := range 100 {
					call(i)
				}
				for i := range 300 {
					time.Sleep(time.Second)
					call(100 + i)
				}
				wg.Wait()

				retries, firsts := mn.counts(0, time.Minute)
				t.Logf("first minute: %d first attempts, %d retries", firsts, retries)
				assert.LessOrEqual(t, retries, 112)
				assert.GreaterOrEqual(t, retries, 100, "the full bucket was spent")
				for minute := 1; minute < 5; minute++ {
					r, _ := mn.counts(time.Duration(minute)*time.Minute, time.Duration(minute+1)*time.Minute)
					t.Logf("minute %d: %d retries", minute+1, r)
					assert.LessOrEqual(t, r, 13, "minute %d: one per five seconds (12), and one more from tokens left over", minute+1)
					assert.GreaterOrEqual(t, r, 11, "minute %d: the budget still pays a retry every five seconds", minute+1)
				}
				// The bucket's invariant: no refund ever came, so the retries
				// up to any moment are at most the bucket and what came back
				// with time.
				mn.mu.Lock()
				defer mn.mu.Unlock()
				for i, at := range mn.retries {
					require.LessOrEqual(t, i+1, 100+int(at/(5*time.Second)), "retry %d at %s", i+1, at)
				}
			})
		})

		// Each call's own policy alone, without the budget: seven attempts in
		// the first minute (at 0, 0.5, 1.5, 3.5, 7.5, 15.5 and 31.5 s), 700 for
		// 100 calls.
		t.Run("without a budget 100 calls make 700 attempts in the first minute against a dead server", func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				mn := newMemoryNet(nil)
				mn.dead = true
				c, err := idem.NewWith(
					idem.WithHTTPClient(&http.Client{Transport: mn}),
					idem.WithStore(persist.NewMemory(nil)),
					idem.WithLookup(contractLookup),
					idem.WithRetryBudget(idem.RetryBudget{Tokens: -1}),
					idem.WithRetryPolicy(idem.RetryPolicy{Jitter: -1}))
				require.NoError(t, err)
				var wg sync.WaitGroup
				for i := range 100 {
					wg.Go(func() {
						_, err := c.Send(context.Background(), fmt.Sprintf("invoice:%d", i), payRequest(i))
						assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
					})
				}
				wg.Wait()
				retries, firsts := mn.counts(0, time.Minute)
				assert.Equal(t, 700, retries+firsts)
			})
		})
	})

	// The defaults over 200 seeds of 100 payments at 30% lost answers, both
	// kinds of loss: every payment ends paid. The short run is one seed.
	t.Run("the defaults pay every payment over many seeds", func(t *testing.T) {
		long.Skip(t, "100 payments at 30% lost answers over 200 seeds")
		t.Parallel()
		for _, silence := range []time.Duration{0, 10 * time.Second} {
			t.Run(fmt.Sprint("silence=", silence), func(t *testing.T) {
				t.Parallel()
				worst := 0
				for seed := uint64(1); seed <= 200; seed++ {
					synctest.Test(t, func(t *testing.T) {
						errs, h, mn := payAtOnce(t, seed, 0.3, silence, idem.RetryBudget{})
						for i, err := range errs {
							require.NoError(t, err, "seed %d, payment %d", seed, i)
						}
						require.Equal(t, 100, h.Stats().ProviderCharges, "seed %d", seed)
						worst = max(worst, mn.lost)
					})
				}
				t.Logf("at most %d answers lost in one run", worst)
			})
		}
	})
}

// keyOf returns the key of the call that err ended.
func keyOf(t *testing.T, err error) string {
	t.Helper()
	var re *idem.RetryError
	require.ErrorAs(t, err, &re)
	return re.Key
}

// memoryNet carries requests to a fake server's handler in memory, for
// tests in a synctest bubble: a goroutine blocked on a loopback socket is
// not durably blocked, so the bubble's clock would stand still. The fake
// server's lost answer (FaultDropResponse: the payment is committed, then
// the connection closes) reaches the client as it would on a real
// network: an unexpected EOF, or, with silence set, nothing until silence
// has passed, then a timeout. With dead set, nothing listens: every
// connection is refused. It records when each request left and whether
// its key was sent before (a retry).
type memoryNet struct {
	h       http.Handler
	silence time.Duration
	dead    bool

	mu      sync.Mutex
	start   time.Time
	seen    map[string]bool
	retries []time.Duration // when each retry left, from start
	firsts  []time.Duration // when each first attempt left
	lost    int
}

func newMemoryNet(h http.Handler) *memoryNet {
	return &memoryNet{h: h, start: time.Now(), seen: map[string]bool{}}
}

func (m *memoryNet) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	key := req.Header.Get("Idempotency-Key")
	m.mu.Lock()
	at := time.Since(m.start)
	if m.seen[key] {
		m.retries = append(m.retries, at)
	} else {
		m.firsts = append(m.firsts, at)
	}
	m.seen[key] = true
	m.mu.Unlock()
	if m.dead {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	rec := httptest.NewRecorder()
	func() {
		defer func() {
			if v := recover(); v != nil {
				if v != http.ErrAbortHandler {
					panic(v)
				}
				err = io.ErrUnexpectedEOF
			}
		}()
		m.h.ServeHTTP(rec, req)
	}()
	if err != nil {
		m.mu.Lock()
		m.lost++
		m.mu.Unlock()
		if m.silence > 0 {
			select {
			case <-time.After(m.silence):
				err = &net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}
			case <-req.Context().Done():
				err = req.Context().Err()
			}
		}
		return nil, err
	}
	resp = rec.Result()
	resp.Request = req
	return resp, nil
}

// counts returns the retries made in [from, to) and the first attempts.
func (m *memoryNet) counts(from, to time.Duration) (retries, firsts int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, at := range m.retries {
		if at >= from && at < to {
			retries++
		}
	}
	for _, at := range m.firsts {
		if at >= from && at < to {
			firsts++
		}
	}
	return retries, firsts
}

// payAtOnce sends 100 payments at once, under budget, to a fake server in
// memory that loses each answer with probability loss: the losses of each
// payment are drawn from seed before it is sent, and injected as the fake
// server's FaultDropResponse on its key. Each call's policy is long (ten
// attempts, no jitter so that the retries of a wave come together, ten
// minutes) so that only the budget can end one early. A payment draws at
// most nine lost answers: the tenth would end it on its policy, which is
// not what is measured. It runs inside a synctest bubble and returns each
// payment's error, the server and the network.
func payAtOnce(t *testing.T, seed uint64, loss float64, silence time.Duration, budget idem.RetryBudget) ([]error, *fakeserver.Handler, *memoryNet) {
	t.Helper()
	h := fakeserver.NewHandler(nil)
	mn := newMemoryNet(h)
	mn.silence = silence
	c, err := idem.NewWith(
		idem.WithHTTPClient(&http.Client{Transport: mn}),
		idem.WithStore(persist.NewMemory(nil)),
		idem.WithLookup(contractLookup),
		idem.WithRetryBudget(budget),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxElapsed: 10 * time.Minute, Jitter: -1}))
	require.NoError(t, err)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x1d3))
	ins := make([]*idem.Intent, 100)
	for i := range ins {
		req, err := idem.JSONRequest(http.MethodPost, "https://api.example/payments", map[string]any{
			"amount": 100 + i, "currency": "EUR", "customer": "cus_1",
		})
		require.NoError(t, err)
		ins[i], err = c.NewIntent(ctx, fmt.Sprintf("invoice:%d", i), req)
		require.NoError(t, err)
		lost := 0
		for lost < 9 && rng.Float64() < loss {
			lost++
		}
		if lost > 0 {
			require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: ins[i].Key(), Count: lost}))
		}
	}
	errs := make([]error, len(ins))
	var wg sync.WaitGroup
	for i, in := range ins {
		wg.Go(func() {
			resp, err := c.Do(ctx, in)
			if err == nil && resp.StatusCode != http.StatusCreated {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errs, h, mn
}
