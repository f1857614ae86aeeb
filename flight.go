package idem

import (
	"context"
	"errors"
	"sync"
)

// flights lets one Do per key run at a time; later callers for the same key
// wait and share its outcome. A waiter's result follows its own context:
// if that ends first, the waiter returns an unknown outcome at once; if the
// call ends for its own caller's context alone (cancelled, or a deadline too
// short for the next attempt), a waiter with time left takes it over.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
	// spare is a flight that ended without ever being waited for, to be
	// used again: no one else can hold it.
	spare *flight
}

// errUnfinished is what the waiters of a Do that panicked get.
var errUnfinished = errors.New("idem: the concurrent Do for this intent did not finish")

type flight struct {
	// done is closed when the flight ends; it is made, under flights.mu,
	// by the first caller that waits for it: most flights have none.
	done chan struct{}
	// exclusive flights (Reconcile, Forget) share no result: a Do waits for
	// them and then makes its own call.
	exclusive bool
	waiters   int // guarded by flights.mu
	resp      *Response
	err       error
	// callerOnly: the call ended for its caller's context alone (cancelled,
	// or its deadline too short), with no answer. Its result is not the
	// waiters': one with time left takes the call over.
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
			// This caller's own context ended while another call had the
			// key on the wire: its outcome is unknown to this caller.
			return nil, waitEnded(key, ctx.Err())
		}
		if !cur.exclusive && !cur.callerOnly {
			return cur.resp.clone(), cur.err
		}
		if err := ctx.Err(); err != nil {
			return nil, waitEnded(key, err)
		}
		// A Reconcile or Forget held the key, or the call ended for its own
		// caller's context: now make this call's own, which reads what the
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

// exclusive runs fn holding key, so that no Do for key runs meanwhile (a
// Do that arrives waits, then runs on its own), and reports true; or, if a
// call for key is under way, runs nothing and reports false.
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

// start registers a flight for key; f.mu is held.
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
// flight if no caller ever waited for it: a waiter makes done as it
// begins to wait, and holds cur after it ends. f.mu is held.
func (f *flights) recycle(cur *flight) {
	if cur.done == nil {
		*cur = flight{}
		f.spare = cur
	}
}

// endedForCaller reports a call that ended because of its caller's context:
// the context is done, or its deadline left no time for the next attempt.
func endedForCaller(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	var retryErr *RetryError
	return errors.As(err, &retryErr) && (retryErr.Reason == stopDeadline || retryErr.Reason == stopCanceled)
}

// waitEnded is the outcome of a call whose context ended while it waited
// for another call of the same intent: unknown, like that of any call that
// gets no answer.
func waitEnded(key string, err error) error {
	reason := stopCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		reason = stopDeadline
	}
	return &RetryError{Key: key, Reason: reason, Err: err}
}

// wait returns the channel closed when the flight ends; flights.mu is held.
func (cur *flight) wait() <-chan struct{} {
	if cur.done == nil {
		cur.done = make(chan struct{})
	}
	return cur.done
}

// end wakes the flight's waiters, if any; flights.mu is held, and the
// flight has left flights.m, so no waiter comes after.
func (cur *flight) end() {
	if cur.done != nil {
		close(cur.done)
	}
}
