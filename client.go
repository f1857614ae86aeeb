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
	// config is what New made of the options, defaults filled in; it
	// never changes after New.
	config
	retry *retrier // sends the attempts of calls through config.http

	flights *flights     // one call per key at a time
	keys    *keys        // what this process knows about each key
	clocks  *clocks      // the device's clocks, to judge an intent's age
	tokens  *tokenBucket // the client-wide retry budget (WithRetryBudget)

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

// New returns a Client. With no options it keeps intents in memory only,
// which is right for tests and wrong on a device: pass WithStore. An option
// given a value out of range (a nil store, a RetryPolicy with a negative
// field, a credential header to store) makes New fail with an error that
// names every such option and says what to pass instead.
func New(opts ...Option) (*Client, error) {
	// The options apply in order, the last of two for one setting wins;
	// newConfig refuses what cannot work, then fills in the defaults.
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Client{
		config:  cfg,
		retry:   newRetrier(cfg.http),
		flights: &flights{},
		keys:    newKeys(),
		clocks:  newClocks(cfg.clock, cfg.store),
		tokens:  newTokenBucket(cfg.retryBudget),
		id:      uuid.NewString(),
	}, nil
}
