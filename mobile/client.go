package mobile

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// Client pays and settles intents kept in a state directory. Open one per
// directory for the life of the app. It is safe for use from several
// threads at once.
type Client struct {
	cfg    Config
	base   *url.URL
	store  *persist.FileStore
	idem   *idem.Client
	events *eventQueue

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup
}

// Open opens the state directory and returns a Client. It creates the
// directory, private to the app. It fails with an error of kind
// KindLocked while another Client has the directory open. It fails with
// kind KindBadInput for a wrong Config.
func Open(cfg *Config) (*Client, error) { return open(cfg) }

// open is Open with edits of the idem.Config the facade makes. Tests use
// them to share a manual clock and the fake server's http.Client.
func open(cfg *Config, edits ...func(*idem.Config)) (*Client, error) {
	c, base, err := cfg.check()
	if err != nil {
		return nil, err
	}
	store, err := persist.OpenDir(c.StateDir, nil)
	if err != nil {
		if errors.Is(err, persist.ErrLocked) {
			return nil, newError(KindLocked, err.Error())
		}
		return nil, newError(KindStorage, err.Error())
	}
	m := &Client{cfg: c, base: base, store: store, events: newEventQueue(c.Listener)}
	retention := time.Duration(c.RetentionMillis) * time.Millisecond
	mark, _ := c.mark() // checked by cfg.check
	server := idem.Server{
		Mark:            mark,
		Retention:       retention,
		RetentionMargin: min(time.Hour, retention/2),
		// The one place the lookup URL is made: LookupPath with the key.
		Lookup: func(_ idem.Request, key string) string {
			u, _ := resolve(base, "LookupPath", strings.ReplaceAll(c.LookupPath, "{key}", url.QueryEscape(key)))
			return u // checked by cfg.check; "" fails the lookup
		},
	}
	icfg := idem.Config{
		Store: store,
		// The credentials are the call's, per attempt
		// (idem.Config.Authorizer).
		HTTPClient: &http.Client{},
		Server:     server,
		RetryPolicy: idem.RetryPolicy{
			MaxAttempts: int(c.MaxAttempts),
			MaxElapsed:  time.Duration(c.BackgroundBudgetMillis) * time.Millisecond,
		},
		OnAttempt:  m.events.hook,
		Authorizer: authorizerOf(c.Authorizer),
	}
	for _, edit := range edits {
		edit(&icfg)
	}
	ic, err := idem.New(icfg)
	if err != nil {
		store.Close()
		m.events.close()
		return nil, newError(KindBadInput, err.Error())
	}
	m.idem = ic
	return m, nil
}

// call runs f with a context bounded by budget and cancel, and maps what it
// returns.
func (c *Client) call(cancel *Cancel, budget int64, f func(ctx context.Context) (*idem.Intent, *idem.Response, error)) (*Result, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, newError(KindClosed, "the client is closed")
	}
	c.calls.Add(1)
	c.mu.Unlock()
	defer c.calls.Done()

	ctx, release := cancel.bind(context.Background())
	defer release()
	// The budget bounds the whole call, waits and attempts included, as
	// the call's retry policy. A tap gets a short one, a settle a long one.
	ctx = idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxElapsed: time.Duration(budget) * time.Millisecond})
	// An Authorizer that fails stops the call, since no retry can fix it.
	// SettleAll stops there too, rather than fail each intent in turn.
	ctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	ctx = context.WithValue(ctx, authFailureKey{}, func(error) { stopAll() })

	in, resp, err := f(ctx)
	if errors.As(err, new(*authError)) {
		// The Result says what became of the intent, whose call the
		// Authorizer ended.
		return resultOf(in, resp, err)
	}
	if cancel.isCanceled() && err != nil && resp == nil {
		// An answer that arrived is returned, whenever Cancel came.
		return nil, newError(KindCanceled, "the call was cancelled; the intent keeps its state")
	}
	return resultOf(in, resp, err)
}

// request builds the intent's request: a POST of body to path.
func (c *Client) request(path string, body []byte) (idem.Request, error) {
	u, err := resolve(c.base, "path", path)
	if err != nil {
		return idem.Request{}, err
	}
	return idem.Request{
		Method: http.MethodPost,
		URL:    u,
		Header: http.Header{"Content-Type": {"application/json"}},
		// gobind's []byte points into memory the JVM frees on return.
		// The intent keeps these bytes for every attempt.
		Body: bytes.Clone(body),
	}, nil
}

// Pay sends the payment for the action name, such as "checkout:cart-42".
// It is a POST of body to path, under the foreground budget. The first Pay
// for a name creates its intent and saves it before sending. A Pay with
// the same body reuses it and its key. So a retry after a crash or a lost
// answer never pays twice. A resolved intent is answered from the device
// (FromStore), without sending. A changed body while the previous intent
// is unresolved returns OutcomeBlocked. Settle that one first.
func (c *Client) Pay(name, path string, body []byte, cancel *Cancel) (*Result, error) {
	return c.pay(name, path, body, cancel, false)
}

// PayAnew starts a new payment for the action name, as after a declined
// card. It makes a new intent with a new key, even if the body is the
// same. It returns OutcomeBlocked while the previous intent for the name
// is unresolved.
func (c *Client) PayAnew(name, path string, body []byte, cancel *Cancel) (*Result, error) {
	return c.pay(name, path, body, cancel, true)
}

func (c *Client) pay(name, path string, body []byte, cancel *Cancel, anew bool) (*Result, error) {
	if name == "" {
		return nil, newError(KindBadInput, "the action name is empty")
	}
	req, err := c.request(path, body)
	if err != nil {
		return nil, err
	}
	return c.call(cancel, c.cfg.ForegroundBudgetMillis, func(ctx context.Context) (*idem.Intent, *idem.Response, error) {
		create := c.idem.Intent
		if anew {
			create = c.idem.NewIntent
		}
		in, err := create(ctx, name, req)
		if err != nil {
			return nil, nil, err
		}
		resp, err := c.idem.Do(ctx, in)
		return in, resp, err
	})
}

// Settle brings the intent with this key to a final state by the safest
// means, under the background budget. While the server keeps its key, it
// sends the intent again with its own key and bytes. That is the way to
// finish an intent left by an earlier run. Once the intent is too old to
// send, it asks the server's lookup instead. There OutcomeVoid means the
// server never did it. OutcomeUnknown means it cannot tell yet. A
// resolved intent is answered from the device.
func (c *Client) Settle(key string, cancel *Cancel) (*Result, error) {
	return c.withIntent(key, cancel, c.idem.Settle)
}

// SettleAll settles every unresolved intent on the device, under the
// background budget. It returns a Result for each, oldest first. It is the
// call for app start. An intent whose last call ended not sent is not
// sent. The user was told so. It goes out again only when the app asks,
// with Pay or with Settle and its key. Its Result is OutcomeNotSent. The
// check is made as each intent is sent, not when the list is taken. So a
// Pay that ends not sent while SettleAll runs is kept too. An intent whose
// call met a storage failure is OutcomeUnknown, since it may have been
// sent. Intents the device cannot read are left out, and Unreadable says
// so.
func (c *Client) SettleAll(cancel *Cancel) (*ResultList, error) {
	var (
		settled []idem.Settled
		listErr error
	)
	if _, err := c.call(cancel, c.cfg.BackgroundBudgetMillis, func(ctx context.Context) (*idem.Intent, *idem.Response, error) {
		settled, listErr = c.idem.SettleAll(ctx)
		return nil, nil, nil
	}); err != nil {
		return nil, err
	}
	if listErr != nil && len(settled) == 0 {
		return nil, deviceError(listErr)
	}
	l := &ResultList{}
	if listErr != nil {
		l.unreadable = deviceError(listErr).Error()
	}
	for _, s := range settled {
		r, err := resultOf(s.Intent, s.Response, s.Err)
		if err != nil {
			// A device error on an intent that may have been sent says
			// nothing of the payment. Its outcome is unknown.
			r = &Result{Key: s.Intent.Key(), Outcome: OutcomeUnknown, Kind: ErrorKind(err), Detail: err.Error()}
		}
		l.items = append(l.items, r)
	}
	return l, nil
}

// withIntent runs op on the stored intent with this key, under the
// background budget.
func (c *Client) withIntent(key string, cancel *Cancel, op func(context.Context, *idem.Intent) (*idem.Response, error)) (*Result, error) {
	return c.call(cancel, c.cfg.BackgroundBudgetMillis, func(ctx context.Context) (*idem.Intent, *idem.Response, error) {
		in, err := c.idem.Load(ctx, key)
		if err != nil {
			return nil, nil, err
		}
		resp, err := op(ctx, in)
		return in, resp, err
	})
}

// Unresolved lists the intents whose outcome is unknown. Settle each at
// app start.
func (c *Client) Unresolved() (*IntentList, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	ins, err := c.idem.Unresolved(context.Background())
	if err != nil {
		return nil, deviceError(err)
	}
	l := &IntentList{}
	for _, in := range ins {
		l.items = append(l.items, infoOf(in))
	}
	return l, nil
}

// Forget deletes the intent with this key from the device. It is the
// unsafe way out. A forgotten unresolved intent may have been paid. A new
// payment for the same action could then pay twice.
func (c *Client) Forget(key string) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	ctx := context.Background()
	in, err := c.idem.Load(ctx, key)
	if err != nil {
		return deviceError(err)
	}
	if err := c.idem.Forget(ctx, in); err != nil {
		return deviceError(err)
	}
	return nil
}

// Prune deletes resolved intents last changed more than olderThanMillis
// ago, and returns how many it deleted. Unresolved intents are kept. So is
// a tombstone of each action's latest payment that succeeded (see
// idem.Client.Prune). So paying for the same action again stays a no-op.
func (c *Client) Prune(olderThanMillis int64) (int64, error) {
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	if olderThanMillis < 0 {
		return 0, newError(KindBadInput, "olderThanMillis is negative")
	}
	n, err := c.idem.Prune(context.Background(), time.Duration(olderThanMillis)*time.Millisecond)
	if err != nil {
		return int64(n), deviceError(err)
	}
	return int64(n), nil
}

// Close waits for the calls under way, closes the state directory and
// stops the listener. Calls made after Close fail with kind KindClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.calls.Wait()
	err := c.store.Close()
	c.events.close()
	if err != nil {
		return deviceError(err)
	}
	return nil
}

func (c *Client) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return newError(KindClosed, "the client is closed")
	}
	return nil
}
