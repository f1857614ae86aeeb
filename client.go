package idem

import (
	"context"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-retryablehttp"
)

// Client sends intents. It stores each intent before its first attempt. It
// retries with the same key and bytes, and stores the final answer.
//
// A Client is safe for concurrent use by multiple goroutines. Two calls of
// Do for the same intent never put two requests on the wire at once. The
// second waits for the first and gets the same outcome. Its own context may
// end first. It then gets a *RetryError matching ErrOutcomeUnknown. Or the
// first may end for its own caller's context alone. The second then resumes
// the intent itself, with the same key. Several Clients may share one store.
// The store decides which intent is an action's latest (see Intent).
type Client struct {
	// config is what New made of its Config, defaults filled in. It never
	// changes after New.
	config
	retry *retrier // sends the attempts of calls through config.http

	// life holds what the durable steps of an intent's life need.
	life

	flights *flights     // one call per key at a time
	tokens  *tokenBucket // the client-wide retry budget (Config.RetryBudget)

	// actionMu serialises the decision "reuse or create" per Client.
	actionMu sync.Mutex
	// unarmed holds, by action, the intent this Client made for it and has
	// not armed. That intent lives in memory only (see Intent). Guarded by
	// actionMu.
	unarmed map[string]*Intent
}

// New returns a Client configured by cfg (see Config). cfg.Server.Mark is
// required. It says how the server marks its answers (see Mark). Without a
// Store, the Client keeps intents in memory only. That is right for tests
// and wrong on a device, so set Config.Store. New fails on a Config without
// a Mark, or with a field out of range. (Say a RetryPolicy with a negative
// field, a credential header to store, or a nil pointer for a store.) Its
// error names every such field and says what to give instead.
func New(cfg Config) (*Client, error) {
	c, err := newConfig(cfg)
	if err != nil {
		return nil, err
	}
	id := uuid.NewString()
	cl := &Client{
		config: c,
		retry:  newRetrier(c.http),
		life: life{
			keys:   newKeys(id),
			clocks: newClocks(c.clock, c.store),
			id:     id,
			revs:   newRevs(),
		},
		flights: &flights{},
		tokens:  newTokenBucket(c.retryBudget),
	}
	// Every read of the Client passes its view of the store.
	cl.config.store = &overrulingStore{Store: c.store, keys: cl.life.keys, rev: cl.life.revs.next, now: c.clock.Now}
	cl.maxElapsed = func(ctx context.Context) time.Duration { return cl.policyFor(ctx).MaxElapsed }
	cl.life.set = &cl.config.lifeConfig
	return cl, nil
}

// newRetrier returns the retrier that sends through hc. It follows only the
// redirects that keep the request (redirectPolicy). It bounds each attempt by
// the call's budget (budgetTransport). It is made once per http.Client and
// shared by all calls.
func newRetrier(hc *http.Client) *retrier {
	hc = redirectPolicy(hc)
	hc.Transport = budgetTransport{base: hc.Transport}
	return &retrier{rc: &retryablehttp.Client{
		HTTPClient: hc,
		RetryMax:   math.MaxInt32, // the budget decides
		RequestLogHook: func(_ retryablehttp.Logger, req *http.Request, _ int) {
			callOf(req.Context()).attemptBegins(req)
		},
		CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			return callOf(ctx).afterAttempt(ctx, resp, err)
		},
		Backoff: func(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 },
		ErrorHandler: func(resp *http.Response, err error, _ int) (*http.Response, error) {
			if resp == nil {
				return nil, err
			}
			return callOf(resp.Request.Context()).keepLast(resp, err)
		},
	}}
}
