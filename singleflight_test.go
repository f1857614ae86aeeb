package idem

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type outcome struct {
	resp *Response
	err  error
}

// A waiter whose own context expires returns at once with an unknown
// outcome (a *RetryError), not a bare context error, while the call it
// waited for goes on.
func TestFlightWaiterWhoseContextExpiresGetsAnUnknownOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var f flights
		release := make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		defer open() // a failed assertion must not leave the leader blocked
		leader := make(chan outcome, 1)
		go func() {
			resp, err := f.do(t.Context(), "k", func() (*Response, error) {
				<-release
				return &Response{StatusCode: http.StatusCreated}, nil
			})
			leader <- outcome{resp, err}
		}()
		synctest.Wait() // the leader holds the key

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
		assert.Equal(t, StopDeadline, retryErr.Reason)
		assert.Equal(t, "k", retryErr.Key)

		open()
		got := <-leader
		require.NoError(t, got.err)
		assert.Equal(t, http.StatusCreated, got.resp.StatusCode)
	})
}

// When the leader's caller cancels, a waiter whose context is alive does
// not get the leader's context.Canceled: it takes the call over.
func TestFlightWaiterWithTimeLeftTakesOverFromACancelledLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var f flights
		leaderCtx, cancelLeader := context.WithCancel(t.Context())
		defer cancelLeader()
		leader := make(chan outcome, 1)
		go func() {
			resp, err := f.do(leaderCtx, "k", func() (*Response, error) {
				<-leaderCtx.Done()
				return nil, &RetryError{Key: "k", Reason: StopCanceled, Attempts: 1, Err: leaderCtx.Err()}
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
}

// A leader that ends because its own deadline left no time for the next
// attempt does not end the calls of waiters with more time either.
func TestFlightWaiterOutlivesALeaderWithAShortDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var f flights
		release := make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		defer open() // a failed assertion must not leave the leader blocked
		leader := make(chan outcome, 1)
		go func() {
			resp, err := f.do(t.Context(), "k", func() (*Response, error) {
				<-release
				return nil, &RetryError{Key: "k", Reason: StopDeadline, Attempts: 1, Wait: time.Minute}
			})
			leader <- outcome{resp, err}
		}()
		synctest.Wait()
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
}
