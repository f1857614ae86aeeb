package idem

import (
	"context"
	"errors"
	"sync"
)

// flights lets one Do per key run at a time; later callers for the same key
// wait and share its outcome.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done chan struct{}
	// exclusive flights (Reconcile, Forget) share no result: a Do waits for
	// them and then makes its own call.
	exclusive bool
	waiters   int // guarded by flights.mu
	resp      *Response
	err       error
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
		f.mu.Unlock()
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if !cur.exclusive {
			return cur.resp.clone(), cur.err
		}
		// A Reconcile or Forget held the key: now make this call's own,
		// which reads what it left in the store.
		f.mu.Lock()
	}
	cur := f.start(key, false)
	f.mu.Unlock()

	var resp *Response
	// Should fn panic, the waiters get this error rather than nothing.
	err := errors.New("idem: the concurrent Do for this intent did not finish")
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		if cur.waiters > 0 {
			// Waiters get their own copy, so no two callers share a body.
			cur.resp, cur.err = resp.clone(), err
		}
		f.mu.Unlock()
		close(cur.done)
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
		f.mu.Unlock()
		close(cur.done)
	}()
	fn()
	return true
}

// start registers a flight for key; f.mu is held.
func (f *flights) start(key string, exclusive bool) *flight {
	if f.m == nil {
		f.m = make(map[string]*flight)
	}
	cur := &flight{done: make(chan struct{}), exclusive: exclusive}
	f.m[key] = cur
	return cur
}
