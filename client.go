package idem

import (
	"cmp"
	"context"
	"fmt"
	"github.com/google/uuid"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// Defaults of a Client; each can be changed with an Option.
const (
	// defaultRetention is the server's retention of idempotency records
	// that the client assumes (the contract's default).
	defaultRetention = 24 * time.Hour
	// defaultSafetyMargin is how long before the server's retention ends
	// the client stops sending a key.
	defaultSafetyMargin = time.Hour
	// defaultReconcileDelay is how long after an intent's last attempt a
	// "not found" from the server's lookup is trusted to mean "never done".
	// It is the longest time the client assumes a request may take from
	// the device to the server's record: held in the network or a proxy's
	// queue, then the server's lease and processing time. A request held
	// longer than that (a proxy that queues it for an hour) can arrive
	// after a "not found" was trusted; only a server that refuses stale
	// requests could close that, and the contract has no such rule.
	defaultReconcileDelay = 2 * time.Minute
	// defaultMaxResponseBytes bounds what is read of one answer: its
	// header fields and body together.
	defaultMaxResponseBytes = 10 << 20
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
	http      *http.Client
	store     persist.Store
	logger    *slog.Logger // nil: silent
	clock     clock.Clock
	policy    RetryPolicy
	retention time.Duration
	margin    time.Duration
	reconcile time.Duration
	maxBody   int64 // bytes read of one answer, header fields included
	quoted    bool
	onAttempt func(Attempt)
	lookup    func(Request, string) string // nil: none configured
	// isKeyReused recognises the app's own server's key reuse answers.
	isKeyReused func(*Response) bool
	// isServerAnswer recognises the app's own server's unmarked answers.
	isServerAnswer func(*Response) bool
	retry          *retrier // sends through http

	invalid []error      // what the options got wrong (see validate)
	tokens  *tokenBucket // the client-wide retry budget (WithRetryBudget)
	settles settleConfig // SettleAll's (WithSettleConcurrency, WithSettleProgress)

	// keptHeaders are the canonical names of the answer's header fields
	// kept on the device.
	keptHeaders []string

	flights flights
	latest  latest
	// intentMu serialises the decision "reuse or create" per Client.
	intentMu sync.Mutex
	// unarmed holds, by action, the intent this Client made for it and has
	// not armed: it lives in memory only (see Intent). Guarded by intentMu.
	unarmed map[string]*Intent
	// unsent holds the keys this Client created and has not yet handed to
	// Do: the only intents known for certain never to have been sent.
	sentMu sync.Mutex
	unsent map[string]struct{}
	// dropped holds the keys of unsent intents that Intent replaced; Do
	// refuses to send them.
	dropped map[string]struct{}
	// handed holds the keys this Client has handed to Do: a record read
	// as not sent may be older than such a Do (see dropUnsent).
	handed map[string]struct{}
	// lastSent holds, for the keys this Client sent and whose outcome is
	// unknown, when its last call of them ended; created, when it created
	// them; both on the in-process timeline (sinceBirth).
	lastSent map[string]reading
	created  map[string]time.Duration

	// id names this Client in the records it arms or takes over
	// (persist.Record.Holder): random, so that each Client, in this process
	// or a later one, is another holder.
	id string

	// markMu guards wallMark, the wall clock's high-water mark.
	markMu   sync.Mutex
	wallMark time.Time
	seedMark sync.Once
	// birth is every clock's reading when the Client was made.
	birth reading

	// born is when the Client was made: on the clock's timeline, and on
	// its clock.Monotonic one when it has one.
	born     time.Time
	bornMono time.Duration
}

// New returns a Client. With no options it keeps intents in memory only,
// which is right for tests and wrong on a device: pass WithStore. An option
// given a value out of range (a nil store, a RetryPolicy with a negative
// field, a credential header to store) makes New fail with an error that
// names every such option and says what to pass instead.
func New(opts ...Option) (*Client, error) {
	c := &Client{id: uuid.NewString()}
	for _, o := range opts {
		if o == nil {
			c.refuse("New: an Option is nil")
			continue
		}
		o(c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if c.http == nil {
		c.http = &http.Client{Timeout: 30 * time.Second}
	}
	if c.store == nil {
		c.store = persist.NewMemory(nil)
	}
	if c.clock == nil {
		c.clock = clock.System()
	}
	c.policy = c.policy.withDefaults()
	if c.retention == 0 {
		c.retention = defaultRetention
	}
	if c.margin == 0 {
		c.margin = defaultSafetyMargin
	}
	if c.retention < 0 || c.margin < 0 || c.margin >= c.retention {
		return nil, fmt.Errorf("idem: retention %s with margin %s leaves no time to send", c.retention, c.margin)
	}
	if c.reconcile <= 0 {
		c.reconcile = defaultReconcileDelay
	}
	if c.maxBody <= 0 {
		c.maxBody = defaultMaxResponseBytes
	}
	c.keptHeaders = keptHeaders(c.keptHeaders)
	c.tokens = cmp.Or(c.tokens, newTokenBucket(RetryBudget{}))
	c.settles.workers = cmp.Or(c.settles.workers, defaultSettleConcurrency)
	c.retry = c.newRetryClient(c.http)
	c.unsent = make(map[string]struct{})
	c.lastSent = make(map[string]reading)
	c.created = make(map[string]time.Duration)
	c.born = c.clock.Now()
	if m, ok := c.clock.(clock.Monotonic); ok {
		c.bornMono = m.Monotonic()
	}
	c.birth = c.read()
	return c, nil
}

func (c *Client) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if c.logger != nil {
		c.logger.Log(ctx, level, msg, args...)
	}
}

// keyHeader spells key as this Client sends the keys of new intents.
func (c *Client) keyHeader(key string) string {
	if !c.quoted {
		return key
	}
	return quoteKey(key)
}

// quoteKey spells key as an RFC 8941 sf-string.
func quoteKey(key string) string {
	v, err := httpsfv.Marshal(httpsfv.NewItem(key))
	if err != nil {
		// Keys are made of visible ASCII, which every sf-string can hold.
		return key
	}
	return v
}

// spells reports whether v is one of the two spellings of key, bare or
// quoted: a stored value that names another key is never sent.
func (c *Client) spells(v, key string) bool { return v == key || v == quoteKey(key) }
