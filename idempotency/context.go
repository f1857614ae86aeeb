package idempotency

import (
	"context"
	"sync"
)

// Info describes the idempotent request a handler is serving. The middleware
// puts it in the request context; read it with [FromContext].
type Info struct {
	// ID is the record's key: the caller and its Idempotency-Key.
	ID ID
	// StableID is the server's own id for the intent, the same on every
	// attempt, including after a takeover. Give it to external providers as
	// their idempotency key.
	StableID string
	// Takeover is true when this request took over the record of a worker
	// whose lease ended. The handler must then find out what the dead worker
	// did (ask the provider about StableID) before doing anything again.
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

// FromContext returns the Info of the idempotent request being served, and
// false when ctx does not come from the middleware.
func FromContext(ctx context.Context) (Info, bool) {
	w, ok := ctx.Value(ctxKey{}).(*work)
	if !ok {
		return Info{}, false
	}
	return w.info, true
}

// OnCommit registers effect, the request's change to the business state, to
// be applied in the same atomic store step that marks the record COMPLETED
// (see "Commit hook" in the package docs). If the answer is a server error
// (>= 500), or the record is lost, the effect is discarded. Effects run in
// registration order and must not call the Store.
//
// When ctx does not come from the middleware (the handler is mounted bare),
// OnCommit runs effect at once and returns its error.
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

// commit applies the registered effects; it is the commit hook handed to
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
// nothing outside the store (no provider was called under its stable id),
// so that if the answer is a server error (>= 500), or the commit fails, the
// record is released and the key is free again. Without it the record is
// kept, IN_PROGRESS with its lease ended, and the next request with the key
// takes it over with the same [Info.StableID] ([Info.Takeover] is true) and
// asks the provider first: a provider call that timed out may have charged.
// A takeover always keeps the record: the dead worker before it may have
// called the provider. When ctx does not come from the middleware,
// NothingDone does nothing.
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
