package idem

import (
	"sync"

	"github.com/google/uuid"
)

// Client sends intents. It stores each intent before its first attempt,
// retries with the same key and bytes, and stores the final answer.
//
// A Client is safe for concurrent use by multiple goroutines. Two calls of
// Do for the same intent never put two requests on the wire at once: the
// second waits for the first and gets the same outcome, unless its own
// context ends first (a *RetryError matching ErrOutcomeUnknown) or the first
// ends for its own caller's context alone (the second then resumes the
// intent itself, with the same key). Several Clients may share one store:
// the store decides which intent is an action's latest (see Intent).
type Client struct {
	// config is what New made of its Config, defaults filled in; it
	// never changes after New.
	config
	retry *retrier // sends the attempts of calls through config.http

	flights *flights     // one call per key at a time
	keys    *keys        // what this process knows about each key
	clocks  *clocks      // the device's clocks, to judge an intent's age
	tokens  *tokenBucket // the client-wide retry budget (Config.RetryBudget)

	// actionMu serialises the decision "reuse or create" per Client.
	actionMu sync.Mutex
	// unarmed holds, by action, the intent this Client made for it and has
	// not armed: it lives in memory only (see Intent). Guarded by actionMu.
	unarmed map[string]*Intent

	// id names this Client in the records it arms or takes over
	// (persist.Record.Holder): random, so that each Client, in this process
	// or a later one, is another holder.
	id string
}

// New returns a Client configured by cfg (see Config). cfg.Server.Mark is
// required: it says how the server marks its answers (see Mark). Without
// a Store, the Client keeps intents in memory only, which is right for
// tests and wrong on a device: set Config.Store. A Config without a Mark,
// or with a field out of range (a RetryPolicy with a negative field, a
// credential header to store, a nil pointer for a store), makes New fail
// with an error that names every such field and says what to give
// instead.
func New(cfg Config) (*Client, error) {
	c, err := newConfig(cfg)
	if err != nil {
		return nil, err
	}
	id := uuid.NewString()
	return &Client{
		config:  c,
		retry:   newRetrier(c.http),
		flights: &flights{},
		keys:    newKeys(id),
		clocks:  newClocks(c.clock, c.store),
		tokens:  newTokenBucket(c.retryBudget),
		id:      id,
	}, nil
}
