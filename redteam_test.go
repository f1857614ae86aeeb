package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// rtEpoch is the red team's start of time.
var rtEpoch = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// rtPhone is the system clock of a phone as Go reads it (clock.System): the
// wall clock, the monotonic reading and the budget's elapsed time stop while
// the phone sleeps; CLOCK_BOOTTIME (SinceBoot) keeps counting. Its Sleep
// waits out a backoff on the true clock; the first Sleep also lets the phone
// fall asleep for `nap` and runs `whileAsleep` (what the rest of the world
// does meanwhile).
type rtPhone struct {
	m           *clock.Manual
	mu          sync.Mutex
	slept       time.Duration
	nap         time.Duration
	whileAsleep func()
}

func (p *rtPhone) Now() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m.Now().Add(-p.slept)
}

func (p *rtPhone) Monotonic() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m.Monotonic() - p.slept
}

func (p *rtPhone) SinceBoot() (time.Duration, string, bool) { return p.m.SinceBoot() }

func (p *rtPhone) Sleep(ctx context.Context, d time.Duration) error {
	if err := p.m.Sleep(ctx, d); err != nil {
		return err
	}
	p.mu.Lock()
	nap, hook := p.nap, p.whileAsleep
	p.nap, p.whileAsleep = 0, nil
	if nap > 0 {
		p.m.Advance(nap) // true time and the clock that counts sleep
		p.slept += nap
	}
	p.mu.Unlock()
	if hook != nil {
		hook()
	}
	return nil
}

func rtPayment(t *testing.T, srv *fakeserver.Server) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "USD", "customer": "cus_1"})
	require.NoError(t, err)
	return req
}

// TestRedTeam_NeverTwice_SleepDuringBackoffPassesTheSendDeadline breaks
// "never twice" and "what the app is told is true" for two Clients on one
// store (the sendDeadline's promise "No clock can let a send begin after
// the deadline. So another Client's lookup may count the reconcile delay
// from it").
//
// Path: Client A arms the intent (its claim says it begins no send past
// arm+MaxElapsed+5s), its first attempt gets a 503, and the phone sleeps
// during the backoff. Go's monotonic clock (the budget's) stops, so on
// waking budget.attemptLimit lets the retry go: it checks MaxElapsed on the
// stopped clock and the retention window, but never the stored send
// deadline (budget.fits checks it only before the wait, in next). Meanwhile
// Client B on the same store saw the deadline plus ReconcileDelay pass on
// every clock, its lookup got the typed miss, and it voided the intent. A's
// retry then charges the card: the app was told "void" for a payment that
// was made, and the user pays again.
func TestRedTeam_NeverTwice_SleepDuringBackoffPassesTheSendDeadline(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	store, err := persist.OpenDir(filepath.Join(t.TempDir(), "store"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	server := idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}

	phone := &rtPhone{m: truth}
	a, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: phone,
		OnAttempt:   func(at idem.Attempt) { t.Logf("A's attempt %d: %d", at.Number, at.StatusCode) },
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 3, MaxElapsed: 30 * time.Second, InitialInterval: time.Second}})
	require.NoError(t, err)
	b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth})
	require.NoError(t, err)

	in, err := a.Intent(ctx, "checkout", rtPayment(t, srv))
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, Key: in.Key()}))

	var voided bool
	phone.nap = 10 * time.Minute
	phone.whileAsleep = func() {
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		t.Logf("B's reconcile while A's phone sleeps: state %s, err %v", loaded.State(), err)
		voided = loaded.State() == persist.StateVoid
	}
	resp, err := a.Do(ctx, in)
	t.Logf("A's Do after waking: resp %v, err %v, state %s", resp != nil, err, in.State())

	charged := srv.Stats().ProviderCharges
	require.True(t, voided, "the setup: B voided the intent while A's phone slept")
	assert.Zero(t, charged, "B told the app the intent is void (nothing charged, nothing will be), but A's retry, begun past its stored send deadline, charged the card")
	if in.State() == persist.StateVoid {
		assert.Zero(t, charged, "A adopted void for a payment the server made")
	}
}

// nap lets the phone fall asleep now for d: true time and the clock that
// counts sleep move, Go's clocks do not.
func (p *rtPhone) napNow(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m.Advance(d)
	p.slept += d
}

// TestRedTeam_NeverTwice_SleepBetweenTheCheckAndTheFirstSend breaks "never
// twice" on the tap's own first attempt, the focus's "a phone asleep between
// the check and the send".
//
// Path: Do arms the intent (claim: no send begins past arm+MaxElapsed+5s)
// and reads the clocks once for the expiry check and mustHold; the first
// attempt then asks Config.Authorizer for a token, and the phone sleeps
// while it refreshes. budget.attemptLimit, the only check before the first
// byte, reads MaxElapsed on Go's stopped clock and never the stored send
// deadline, so the request goes out ten minutes past it; Client B on the
// same store voided the intent in between (the deadline plus ReconcileDelay
// passed on every clock), and the card is charged.
func TestRedTeam_NeverTwice_SleepBetweenTheCheckAndTheFirstSend(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	store, err := persist.OpenDir(filepath.Join(t.TempDir(), "store"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	server := idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}

	b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth,
		Authorizer: func(context.Context, string) (string, error) { return "Bearer test_acme_1", nil }})
	require.NoError(t, err)
	phone := &rtPhone{m: truth}
	var key string
	var voided, once bool
	authorize := func(ctx context.Context, _ string) (string, error) {
		if !once {
			once = true
			phone.napNow(10 * time.Minute) // the token refresh waits on the network; the phone sleeps
			loaded, err := b.Load(ctx, key)
			require.NoError(t, err)
			_, err = b.Reconcile(ctx, loaded)
			t.Logf("B's reconcile while A's phone sleeps: state %s, err %v", loaded.State(), err)
			voided = loaded.State() == persist.StateVoid
		}
		return "Bearer test_acme_2", nil
	}
	a, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: phone, Authorizer: authorize,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 1, MaxElapsed: 30 * time.Second}})
	require.NoError(t, err)

	in, err := a.Intent(ctx, "checkout", rtPayment(t, srv))
	require.NoError(t, err)
	key = in.Key()
	resp, err := a.Do(ctx, in)
	t.Logf("A's Do: resp %v, err %v, state %s", resp != nil, err, in.State())

	charged := srv.Stats().ProviderCharges
	if voided {
		assert.Zero(t, charged, "B told the app the intent is void, but A's first attempt, begun past its stored send deadline, charged the card")
	}
	assert.NotEqual(t, persist.StateVoid, in.State(), "A reports void for a payment the server made (%d charge(s))", charged)
}

// TestRedTeam_TrueOutcome_TheServersAnswerInHandLosesToAStoredVoid breaks
// "what the app is told is true" for the Client that holds the server's
// own word.
//
// Path: Client A's attempt begins in time but a proxy queues it past
// ReconcileDelay (the limit Server.ReconcileDelay documents); Client B on
// the same store meanwhile voids the intent from the lookup's typed miss.
// The request then reaches the server, which charges and answers A 201 with
// the key's echo; A's save of that answer conflicts with the stored void,
// afterConflict adopts any resolved record before it looks at whether the
// write is the server's answer (cAdopt before cOver), and Do tells the app
// "void: the server has no effect for its key; create a new intent to try
// again" with the 201 in hand, so the app charges the user again.
func TestRedTeam_TrueOutcome_TheServersAnswerInHandLosesToAStoredVoid(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	store, err := persist.OpenDir(filepath.Join(t.TempDir(), "store"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	server := idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}
	b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth})
	require.NoError(t, err)

	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = srv.Client().Transport
	var voided atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			// The proxy's queue holds the request ten minutes; meanwhile B
			// settles the intent through the lookup, straight to the server.
			truth.Advance(10 * time.Minute)
			loaded, err := b.Load(ctx, r.Header.Get("Idempotency-Key"))
			if err == nil {
				_, err = b.Reconcile(ctx, loaded)
				voided.Store(loaded.State() == persist.StateVoid)
			}
			t.Logf("B's reconcile while the proxy holds A's request: err %v", err)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	a, err := idem.New(idem.Config{Store: store, HTTPClient: front.Client(), Server: server, Clock: truth,
		OnAttempt:   func(at idem.Attempt) { t.Logf("A's attempt %d: %d", at.Number, at.StatusCode) },
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
	require.NoError(t, err)
	req := rtPayment(t, srv)
	req.URL = front.URL + "/payments"
	in, err := a.Intent(ctx, "checkout", req)
	require.NoError(t, err)
	resp, err := a.Do(ctx, in)
	t.Logf("A's Do: resp %v, err %v, state %s", resp != nil, err, in.State())
	require.True(t, voided.Load(), "the setup: B voided the intent while the request was queued")
	require.Equal(t, 1, srv.Stats().ProviderCharges, "the setup: the queued request charged")

	assert.NotEqual(t, persist.StateVoid, in.State(), "A holds the server's 201 yet reports void")
	assert.NoError(t, err, "A holds the server's 201 for its key")
}
