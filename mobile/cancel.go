package mobile

import (
	"context"
	"sync"
)

// Cancel stops a call from another thread. Make one: Cancel() in Kotlin,
// MobileCancel() in Swift, &Cancel{} in Go. The zero Cancel is ready. Pass
// it to the call, and call Cancel from anywhere. The call then returns
// promptly with an error of kind KindCanceled. A Cancel serves one call at
// a time. Cancelling before the call starts makes it return at once. The
// call it was passed to spends it. Passed to the next call, it is ready
// again.
type Cancel struct {
	mu       sync.Mutex
	canceled bool
	stop     context.CancelFunc
}

// Cancel stops the call this handle was passed to. It is safe to call from
// any thread, more than once.
func (c *Cancel) Cancel() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.canceled = true
	if c.stop != nil {
		c.stop()
	}
}

// isCanceled reports whether Cancel was called.
func (c *Cancel) isCanceled() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.canceled
}

// bind ties ctx to the handle; the returned function releases it.
func (c *Cancel) bind(ctx context.Context) (context.Context, func()) {
	ctx, stop := context.WithCancel(ctx)
	if c == nil {
		return ctx, stop
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.canceled {
		stop()
	}
	c.stop = stop
	return ctx, func() {
		c.mu.Lock()
		// The call is over. A Cancel it got is spent, and the next call
		// this handle is passed to runs.
		c.stop, c.canceled = nil, false
		c.mu.Unlock()
		stop()
	}
}
