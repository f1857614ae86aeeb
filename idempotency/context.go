package idempotency

import (
	"context"
	"sync"
)

// Info describes the idempotent request a handler is serving. The
// middleware puts it in the request context. Read it with [FromContext].
type Info struct {
	// ID is the record's key: the caller and its Idempotency-Key.
	ID ID
	// StableID is the server's own id for the intent. It is the same on
	// every attempt, including after a takeover. Give it to external
	// providers as their idempotency key.
	StableID string
	// Takeover is true when this request took over the record of a worker
	// whose lease ended. The handler must then find out what the dead
	// worker did. It asks the provider about StableID before doing
	// anything again.
	Takeover bool
	// Validated is what Config.Validate returned for the request's body,
	// or nil.
	Validated any
}

type ctxKey struct{}

// work is the per-request state the middleware shares with the handler.
type work struct {
	info    Info
	mu      sync.Mutex
	effects []func(context.Context) error
	// nothingDone: the handler said it did nothing outside the store.
	nothingDone bool
}

// FromContext returns the Info of the idempotent request being served.
// It returns false when ctx does not come from the middleware.
func FromContext(ctx context.Context) (Info, bool) {
	w, ok := ctx.Value(ctxKey{}).(*work)
	if !ok {
		return Info{}, false
	}
	return w.info, true
}

// OnCommit registers effect, the request's change to the business state.
// The effect is applied in the atomic store step that marks the record
// COMPLETED. If the answer is a server error (>= 500), the effect is
// dropped. It is also dropped if the record is lost. Effects run in
// registration order, and must not call the Store. docs/SERVER.md, "The
// commit", tells the whole rule.
//
// ctx may not come from the middleware, as when the handler is mounted
// bare. Then OnCommit runs effect at once and returns its error.
func OnCommit(ctx context.Context, effect func(context.Context) error) error {
	w, ok := ctx.Value(ctxKey{}).(*work)
	if !ok {
		return effect(ctx)
	}
	w.mu.Lock()
	w.effects = append(w.effects, effect)
	w.mu.Unlock()
	return nil
}

// pending reports whether the handler registered an effect.
func (w *work) pending() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.effects) > 0
}

// commit applies the registered effects. It is the commit hook handed to
// Store.Complete.
func (w *work) commit(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.effects {
		if err := e(ctx); err != nil {
			return err
		}
	}
	return nil
}

// NothingDone tells the middleware that the request being served has done
// nothing outside the store. No provider was called under its stable id.
// Then a server error (>= 500), or a failed commit, releases the record.
// The key is free again.
//
// Without NothingDone, the record is kept, IN_PROGRESS with its lease
// ended. The next request with the key takes it over with the same
// [Info.StableID], and [Info.Takeover] set. It asks the provider first,
// since a call that timed out may have charged. A takeover always keeps
// the record, since its dead worker may have called the provider.
//
// When ctx does not come from the middleware, NothingDone does nothing.
func NothingDone(ctx context.Context) {
	if w, ok := ctx.Value(ctxKey{}).(*work); ok {
		w.mu.Lock()
		w.nothingDone = true
		w.mu.Unlock()
	}
}

// released reports whether a server error may release the record.
func (w *work) released() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nothingDone && !w.info.Takeover
}
