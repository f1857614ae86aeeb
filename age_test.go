package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// deviceClock is a device's wall clock over the true time of a manual
// clock: the user (or a bad network time) can set it anywhere with Jump,
// while its Monotonic reading, like a real device's, keeps counting the
// true time. It has no reading that counts sleep.
type deviceClock struct {
	clock.NoBoot
	true  *clock.Manual
	start time.Time
	mu    sync.Mutex
	skew  time.Duration
}

func newDeviceClock(true *clock.Manual) *deviceClock {
	return &deviceClock{true: true, start: true.Now()}
}

func (d *deviceClock) Now() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.true.Now().Add(d.skew)
}

func (d *deviceClock) Sleep(ctx context.Context, dur time.Duration) error {
	return d.true.Sleep(ctx, dur)
}

func (d *deviceClock) Monotonic() time.Duration { return d.true.Now().Sub(d.start) }

// Jump sets the wall clock by by, forward or back.
func (d *deviceClock) Jump(by time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.skew += by
}

// heldNetwork holds POSTs in transit: the sender sees the connection fail,
// and the request reaches the server only when deliver is called, as a
// request queued in a slow uplink or a proxy does.
type heldNetwork struct {
	base http.RoundTripper
	mu   sync.Mutex
	hold int
	held []*http.Request
}

var errHeld = errors.New("connection lost while the request was held in the network")

func (n *heldNetwork) holdNext(count int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hold += count
}

func (n *heldNetwork) RoundTrip(req *http.Request) (*http.Response, error) {
	n.mu.Lock()
	if req.Method != http.MethodPost || n.hold == 0 {
		n.mu.Unlock()
		return n.base.RoundTrip(req)
	}
	n.hold--
	n.mu.Unlock()
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body.Close()
	later := req.Clone(context.Background())
	later.Body = io.NopCloser(bytes.NewReader(body))
	later.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	n.mu.Lock()
	n.held = append(n.held, later)
	n.mu.Unlock()
	return nil, errHeld
}

// deliver lets every held request reach the server, and drops the answers.
func (n *heldNetwork) deliver(t testing.TB) {
	t.Helper()
	n.mu.Lock()
	held := n.held
	n.held = nil
	n.mu.Unlock()
	for _, req := range held {
		resp, err := n.base.RoundTrip(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestAge keeps an intent's age on every clock the device has: no clock
// set back or forward, and no sleep, makes a payment resent or voided.
func TestAge(t *testing.T) {
	t.Parallel()

	t.Run("a clock jump forward does not shorten the reconcile delay", func(t *testing.T) {
		t.Parallel()
		truth := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
		t.Cleanup(srv.Close)
		net := &heldNetwork{base: srv.Client().Transport}
		device := newDeviceClock(truth)
		c, err := idem.NewWith(idem.WithLookup(contractLookup), idem.WithHTTPClient(&http.Client{Transport: net}), idem.WithClock(device), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		ctx := context.Background()
		in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		net.holdNext(1)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		device.Jump(25 * time.Hour) // the clock leaps a day ahead: the intent looks expired, its attempt long over
		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the attempt left a moment ago and may still arrive")
		assert.NotEqual(t, persist.StateVoid, in.State())

		net.deliver(t) // it arrives: the server charges
		truth.Advance(reconcileDelay)
		_, err = c.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, 1, srv.Stats().Payments)
	})

	t.Run("a clock set back does not make an intent younger", func(t *testing.T) {
		t.Parallel()
		truth := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
		t.Cleanup(srv.Close)
		device := newDeviceClock(truth)
		c, err := idem.NewWith(idem.WithLookup(contractLookup), idem.WithHTTPClient(srv.Client()), idem.WithClock(device), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		ctx := context.Background()
		in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		truth.Advance(sendWindow)
		device.Jump(-5 * time.Hour) // by the wall clock the intent is 18 hours old
		requests := srv.Stats().Requests
		_, err = c.Do(ctx, in)
		requireStop(t, err, idem.StopExpired, "the intent is as old as the time that passed")
		assert.Equal(t, requests, srv.Stats().Requests, "nothing is sent")
	})

	// The wall clock is set back five hours while the app is not running:
	// the high-water mark stored with the records, which a clock set back
	// cannot lower, still tells the intent's age after the restart, on a
	// device with no clock that counts sleep.
	t.Run("a clock set back before a restart does not make an intent younger", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
		t.Cleanup(srv.Close)
		store := persist.NewMemory(nil)
		device := newDeviceClock(truth)
		open := func() *idem.Client {
			c, err := idem.NewWith(idem.WithStore(store), idem.WithHTTPClient(srv.Client()), idem.WithClock(device), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
			require.NoError(t, err)
			return c
		}
		c := open()
		old, err := c.Intent(ctx, "checkout:old", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, old)) // tapped; the app dies before its first byte

		truth.Advance(sendWindow + time.Minute)
		c = open()
		later, err := c.NewIntent(ctx, "checkout:later", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, later)) // the app saw this wall time

		device.Jump(-5 * time.Hour)
		c = open()
		loaded, err := c.Load(ctx, old.Key())
		require.NoError(t, err)
		requests := srv.Stats().Requests
		_, err = c.Do(ctx, loaded)
		requireStop(t, err, idem.StopExpired, "by the wall clock the intent is 18 hours old; by the mark, past the send window")
		assert.Equal(t, requests, srv.Stats().Requests, "nothing is sent")
	})

	// An intent 22h58m old is resumed, its attempt fails, and the phone sleeps
	// two hours during the backoff: by Go's monotonic reading no time passed,
	// but the server's retention did. Nothing is sent after it.
	t.Run("nothing is resent past retention when the device sleeps during a backoff", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:sleepy", 1500)
		e.clock.Advance(22*time.Hour + 58*time.Minute)

		device := &goClock{m: e.clock, sleepFor: 2 * time.Hour}
		resumed := e.newClient(t, idem.WithClock(device), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Second}))
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, Key: in.Key(), Count: 1})
		loaded, err := resumed.Load(ctx, in.Key())
		require.NoError(t, err)
		requests := e.srv.Stats().Requests
		_, err = resumed.Do(ctx, loaded)
		requireStop(t, err, idem.StopExpired, "the intent is 24h58m old by the clock that counts sleep")
		assert.Equal(t, requests+1, e.srv.Stats().Requests, "one attempt, before the sleep")
		assert.Zero(t, e.srv.Stats().ProviderCharges)
	})

	// A phone sleeps two hours and its wall clock is set back two hours while
	// it sleeps; the intent's window is one hour. The one reading shared by the
	// expiry check and mustHold still sees it expired: nothing is sent.
	t.Run("a clock set back during sleep does not revive an expired intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		server := echoLookupServer
		server.Retention, server.RetentionMargin = 2*time.Hour, time.Hour
		c, err := idem.New(idem.Config{HTTPClient: srv.Client(), Server: server, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		truth.Advance(2 * time.Hour)
		truth.Advance(-2 * time.Hour)
		requests := srv.Stats().Requests
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Equal(t, requests, srv.Stats().Requests, "nothing is sent")
		assert.Equal(t, persist.StateExpired, in.State())
	})

	// The phone sleeps two hours inside the Authorizer, between the one clock
	// reading of the expiry check and the first byte; the intent's window is
	// one hour. The attempt's own limit reads the clock that counts sleep, and
	// nothing is sent.
	t.Run("a sleep before the first byte does not send an expired intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		server := echoLookupServer
		server.Retention, server.RetentionMargin = 2*time.Hour, time.Hour
		phone := &goClock{m: truth}
		var napped bool
		c, err := idem.New(idem.Config{HTTPClient: srv.Client(), Server: server, Clock: phone, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1},
			Authorizer: func(context.Context, string) (string, error) {
				if !napped {
					napped = true
					phone.napNow(2 * time.Hour)
				}
				return "Bearer test_acme_1", nil
			}})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Zero(t, srv.Stats().Requests, "nothing is sent past the window")
	})
}

func payment1500(t testing.TB, srv *fakeserver.Server) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	return req
}

// goClock is a device's clocks as Go's time package shows them: Now, and
// every difference of two of its readings, stops while the device sleeps,
// as the monotonic reading of time.Now does on Linux, Android and Darwin;
// SinceBoot counts the sleep. sleepFor is how long the device sleeps
// during the next wait; whileAsleep, if set, runs once after that sleep
// (what the rest of the world does meanwhile).
type goClock struct {
	m           *clock.Manual
	mu          sync.Mutex
	slept       time.Duration
	sleepFor    time.Duration
	whileAsleep func()
}

func (g *goClock) Now() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.m.Now().Add(-g.slept)
}

func (g *goClock) Monotonic() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.m.Monotonic() - g.slept
}

func (g *goClock) SinceBoot() (time.Duration, string, bool) { return g.m.SinceBoot() }

func (g *goClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := g.m.Sleep(ctx, d); err != nil {
		return err
	}
	g.mu.Lock()
	if g.sleepFor > 0 {
		g.m.Advance(g.sleepFor) // the true time, and the clock that counts sleep
		g.slept += g.sleepFor
		g.sleepFor = 0
	}
	hook := g.whileAsleep
	g.whileAsleep = nil
	g.mu.Unlock()
	if hook != nil {
		hook()
	}
	return nil
}

func TestSendAge(t *testing.T) {
	t.Parallel()
	t.Run("an offline tap retried a day later is sent, not expired", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		hc, down := switchable()
		c := e.newClient(t, idem.WithHTTPClient(hc))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		down.Store(true)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrNotSent)

		e.clock.Advance(25 * time.Hour) // the next day, online
		down.Store(false)
		_, err = c.Do(ctx, in)
		require.NoError(t, err, "its age counts from the first moment a send could begin")
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
}

// phoneEpoch is the start of time of the tests of a phone that sleeps.
var phoneEpoch = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// phoneWorld is the true time of a phone's test, from phoneEpoch, and a
// fake server that runs on it.
func phoneWorld(t *testing.T) (*clock.Manual, *fakeserver.Server) {
	t.Helper()
	truth := clock.NewManual(phoneEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	return truth, srv
}

// phoneStore is phoneWorld with a file store that the test's Clients
// share.
func phoneStore(t *testing.T) (*clock.Manual, *fakeserver.Server, *persist.FileStore) {
	t.Helper()
	truth, srv := phoneWorld(t)
	store := dirStore(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { store.Close() })
	return truth, srv, store
}

// proxyTo is a reverse proxy to srv: a front on the path to the server.
func proxyTo(t *testing.T, srv *fakeserver.Server) *httputil.ReverseProxy {
	t.Helper()
	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = srv.Client().Transport
	return proxy
}

// napNow lets the phone fall asleep now for d: true time and the clock that
// counts sleep move, Go's clocks do not.
func (g *goClock) napNow(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.m.Advance(d)
	g.slept += d
}

// dirStore opens a file store in dir.
func dirStore(t *testing.T, dir string) *persist.FileStore {
	t.Helper()
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	return s
}

// echoLookupServer is a server that echoes the key and answers lookups.
var echoLookupServer = idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}
