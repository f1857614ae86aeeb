package idem

import (
	"context"
	"errors"
	"sync"
)

// flights lets one Do per key run at a time. Later callers for the same key
// wait and share its outcome. A waiter's result follows its own context. If
// that ends first, the waiter returns an unknown outcome at once. The call
// may end for its own caller's context alone. (It was cancelled, or its
// deadline was too short for the next attempt.) Then a waiter with time left
// takes the call over.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
	// spare is a flight that ended without ever being waited for. It is used
	// again, and no one else can hold it.
	spare *flight
}

// ErrInFlight means the operation needs the intent to be idle. A Do
// for it is running in this process.
var ErrInFlight = errors.New("idem: a request for this intent is in flight")

// errUnfinished is what the waiters of a Do that panicked get.
var errUnfinished = errors.New("idem: the concurrent Do for this intent did not finish")

type flight struct {
	// done is closed when the flight ends. The first caller that waits for
	// it makes it, under flights.mu. Most flights have none.
	done chan struct{}
	// exclusive flights (Reconcile, Forget) share no result. A Do waits for
	// them and then makes its own call.
	exclusive bool
	waiters   int // guarded by flights.mu
	resp      *Response
	err       error
	// callerOnly means the call ended for its caller's context alone, with
	// no answer. (It was cancelled, or its deadline was too short.) Its
	// result is not the waiters'. One with time left takes the call over.
	callerOnly bool
}

func (f *flights) do(ctx context.Context, key string, fn func() (*Response, error)) (*Response, error) {
	f.mu.Lock()
	for {
		cur, ok := f.m[key]
		if !ok {
			break
		}
		if !cur.exclusive {
			cur.waiters++
		}
		done := cur.wait()
		f.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			// This caller's own context ended while another call had the key
			// on the wire. The outcome is unknown to this caller.
			return nil, waitEnded(key, ctx.Err())
		}
		if !cur.exclusive && !cur.callerOnly {
			return cur.resp.clone(), cur.err
		}
		if err := ctx.Err(); err != nil {
			return nil, waitEnded(key, err)
		}
		// A Reconcile or Forget held the key, or the call ended for its
		// caller's context. Now make this call's own. It reads what the
		// other left in the store.
		f.mu.Lock()
	}
	cur := f.start(key, false)
	f.mu.Unlock()

	var resp *Response
	// Should fn panic, the waiters get this error rather than nothing.
	err := errUnfinished
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		cur.callerOnly = resp == nil && endedForCaller(ctx, err)
		if cur.waiters > 0 && !cur.callerOnly {
			// Waiters get their own copy, so no two callers share a body.
			cur.resp, cur.err = resp.clone(), err
		}
		cur.end()
		f.recycle(cur)
		f.mu.Unlock()
	}()
	resp, err = fn()
	return resp, err
}

// exclusive runs fn holding key, so that no Do for key runs meanwhile. A Do
// that arrives waits, then runs on its own. exclusive then reports true. If
// a call for key is under way, it runs nothing and reports false.
func (f *flights) exclusive(key string, fn func()) bool {
	f.mu.Lock()
	if _, ok := f.m[key]; ok {
		f.mu.Unlock()
		return false
	}
	cur := f.start(key, true)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		cur.end()
		f.mu.Unlock()
	}()
	fn()
	return true
}

// start registers a flight for key. f.mu is held.
func (f *flights) start(key string, exclusive bool) *flight {
	if f.m == nil {
		f.m = make(map[string]*flight)
	}
	cur := f.spare
	if cur == nil {
		cur = &flight{}
	}
	f.spare = nil
	cur.exclusive = exclusive
	f.m[key] = cur
	return cur
}

// recycle keeps cur, which has ended and left flights.m, for the next
// flight. It does so only if no caller ever waited for cur. A waiter makes
// done as it begins to wait, and holds cur after it ends. f.mu is held.
func (f *flights) recycle(cur *flight) {
	if cur.done == nil {
		*cur = flight{}
		f.spare = cur
	}
}

// endedForCaller reports a call that ended because of its caller's context.
// The context is done, or its deadline left no time for the next attempt.
func endedForCaller(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	var retryErr *RetryError
	return errors.As(err, &retryErr) && (retryErr.Reason == stopDeadline || retryErr.Reason == stopCanceled)
}

// waitEnded is the outcome of a call whose context ended while it waited. It
// waited for another call of the same intent. The outcome is unknown, like
// that of any call that gets no answer.
func waitEnded(key string, err error) error {
	reason := stopCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		reason = stopDeadline
	}
	return &RetryError{Key: key, Reason: reason, Err: err}
}

// wait returns the channel closed when the flight ends. flights.mu is held.
func (cur *flight) wait() <-chan struct{} {
	if cur.done == nil {
		cur.done = make(chan struct{})
	}
	return cur.done
}

// end wakes the flight's waiters, if any. flights.mu is held. The flight has
// left flights.m, so no waiter comes after.
func (cur *flight) end() {
	if cur.done != nil {
		close(cur.done)
	}
}
