package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
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
	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/persist"
)

// dyingStore is a device store whose process dies: after die, no write
// reaches the disk.
type dyingStore struct {
	persist.Store
	dead atomic.Bool
	// dieOnSend: the process dies as its next request goes out (sending).
	dieOnSend atomic.Bool
}

func (s *dyingStore) Write(ctx context.Context, r, old *persist.Record) error {
	if s.dead.Load() {
		return errors.New("the process died")
	}
	return s.Store.Write(ctx, r, old)
}

// sending returns rt, through which a request going out kills the process
// once dieOnSend is set: the request is in transit, and nothing after it
// is recorded.
func (s *dyingStore) sending(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPost && s.dieOnSend.Load() {
			s.dead.Store(true)
		}
		return rt.RoundTrip(r)
	})
}

// slowLookup answers a lookup, then lets two seconds pass and the held
// requests arrive before the answer reaches the client.
type slowLookup struct {
	base  http.RoundTripper
	clock *clock.Manual
	net   *heldNetwork
	t     testing.TB
}

func (s *slowLookup) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(req)
	if req.Method == http.MethodGet {
		s.clock.Advance(2 * time.Second)
		s.net.deliver(s.t)
	}
	return resp, err
}

// reconcileLostAnswer pays 1500 under action through a Client made with
// opts (one attempt), loses the answer, and returns what Reconcile then
// finds: the payment, succeeded.
func reconcileLostAnswer(t *testing.T, action string, opts ...idem.Option) (*idem.Response, *idem.Intent) {
	t.Helper()
	e := newEnv(t, append([]idem.Option{idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1})}, opts...)...)
	in := e.newIntent(t, action, 1500)
	e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := e.client.Do(context.Background(), in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	resp, err := e.client.Reconcile(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, persist.StateSucceeded, in.State())
	return resp, in
}

// gateStore holds the first Get after arm until release, so a test can
// start a second call while the first is inside the store.
type gateStore struct {
	persist.Store
	armed   chan struct{} // closed by the held Get once it is waiting
	release chan struct{}
	once    sync.Once
	on      bool
	mu      sync.Mutex
}

func (g *gateStore) Get(ctx context.Context, key string) (*persist.Record, error) {
	g.mu.Lock()
	hold := g.on
	g.on = false
	g.mu.Unlock()
	if hold {
		g.once.Do(func() { close(g.armed) })
		<-g.release
	}
	return g.Store.Get(ctx, key)
}

// lookupStrangers are the answers that something in front of the server
// gives the lookup URL: none is the server's word on the key.
var lookupStrangers = []struct {
	name   string
	answer func(w http.ResponseWriter, r *http.Request)
}{
	{"ingress HTML 404", func(w http.ResponseWriter, _ *http.Request) {
		strangerPage(w, http.StatusNotFound, "text/html", "<html><body><h1>404 Not Found</h1>nginx</body></html>")
	}},
	{"CDN JSON 404", func(w http.ResponseWriter, _ *http.Request) {
		strangerPage(w, http.StatusNotFound, "application/problem+json", `{"type":"about:blank","title":"Not Found","status":404}`)
	}},
	{"404 that echoes the key but is not the typed miss", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotency-Key", r.URL.Query().Get("idempotency_key"))
		strangerPage(w, http.StatusNotFound, "text/html", "<html>Not Found</html>")
	}},
	{"single-page app fallback 200", func(w http.ResponseWriter, _ *http.Request) {
		strangerPage(w, http.StatusOK, "text/html", `<!doctype html><html><div id="root"></div></html>`)
	}},
	{"JSON 200 without the echo", func(w http.ResponseWriter, _ *http.Request) {
		strangerPage(w, http.StatusOK, "application/json", `{"data":[]}`)
	}},
	{"gateway 401", func(w http.ResponseWriter, _ *http.Request) {
		strangerPage(w, http.StatusUnauthorized, "application/json", `{"message":"Unauthorized"}`)
	}},
	{"WAF 403", func(w http.ResponseWriter, _ *http.Request) {
		strangerPage(w, http.StatusForbidden, "text/html", "<html>Access denied</html>")
	}},
	{"proxy 407", func(w http.ResponseWriter, _ *http.Request) {
		strangerPage(w, http.StatusProxyAuthRequired, "text/html", "<html>Proxy authentication required</html>")
	}},
}

func isLookup(r *http.Request) bool {
	return r.Method == http.MethodGet && r.URL.Query().Has("idempotency_key")
}

// heldWorld returns a fake server on a manual clock, and a network in
// front of it that can hold a request in transit and deliver it later.
func heldWorld(t *testing.T) (*clock.Manual, *fakeserver.Server, *heldNetwork) {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	return clk, srv, &heldNetwork{base: srv.Client().Transport}
}

// oneAttemptClient is a Client with the contract's lookup and one attempt a
// call, on clk and hc; opts add the rest (a store the test keeps, say).
func oneAttemptClient(t *testing.T, clk clock.Clock, hc *http.Client, opts ...idem.Option) *idem.Client {
	t.Helper()
	base := []idem.Option{idem.WithLookup(contractLookup), idem.WithClock(clk), idem.WithHTTPClient(hc),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1})}
	c, err := idem.NewWith(append(base, opts...)...)
	require.NoError(t, err)
	return c
}

// echoClient returns a fake server on a manual clock, and a Client of it
// on store: one attempt a call, the server's echo and the contract's
// lookup.
func echoClient(t *testing.T, store persist.Store) (*clock.Manual, *fakeserver.Server, *idem.Client) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	client, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Clock: clk,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 1},
		Server:      idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
	require.NoError(t, err)
	return clk, srv, client
}

// TestReconcile: a lookup's miss settles an intent only when no attempt
// of it can still arrive, whichever Client sent it.
func TestReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Path (the simulation's seed 49816493): the holder resumes an intent
	// whose first send was long ago; its attempt is held in transit and
	// the call ends unknown. The other Client on the device reconciles at
	// once. The stored send deadline was the first send's, long past, so
	// the lookup's miss voided the intent; the held request then landed,
	// and the changed cart paid again.
	t.Run("a miss right after the holder resumed it, seen by another Client, never voids", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		other := e.newClient(t) // started with the app, long before
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.unknownOutcome(t, in, fakeserver.FaultReset)
		e.clock.Advance(time.Hour) // the first send's reconcile delay is long past

		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
		_, err = e.client.Do(oneAttempt(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		stored, err := other.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = other.Reconcile(ctx, stored)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the resumed attempt may still arrive")
		assert.NotEqual(t, persist.StateVoid, stored.State())
	})

	// Path: the holder resumes an intent whose first send was long ago,
	// and the process dies while the resumed request is in transit, before
	// it records anything. The other Client on the device started long
	// before and reconciles at once. The stored send deadline was the
	// first send's, long past: the miss voided the intent, the held
	// request landed, and the payment made read void.
	// Paths found by a red-team pass, each described on its function.
	t.Run("a resume whose write is slow sends nothing past the deadline it stored", reconcileAfterASlowResumeWrite)
	t.Run("a holder's resume under a clock set back writes a later deadline", reconcileAfterAResumeUnderAClockSetBack)
	t.Run("a tap under a clock set back stores its deadline by the clock's high-water mark", reconcileAfterATapUnderAClockSetBack)
	t.Run("a Client that took an intent over waits for the call it took it from", reconcileAfterATakeOver)
	t.Run("a take-over never shortens the send deadline of the call it took over", reconcileAfterATakeOverWithAShorterBudget)

	// Path (found by a red-team pass): on a device with no clock that
	// counts sleep, a Client made at the app's start reconciles the
	// intent another Client's attempt left in transit, after the user set
	// the wall clock an hour forward. The stored send deadline, read on
	// the wall clock alone, seemed an hour past: the miss voided the
	// intent, and the held attempt then charged it.
	t.Run("a miss after the wall clock was set forward, with no clock that counts sleep, never voids", func(t *testing.T) {
		t.Parallel()
		truth, srv, net := heldWorld(t)
		store := persist.NewMemory(nil)
		device := &noBootClock{m: truth}
		b := oneAttemptClient(t, device, srv.Client(), idem.WithStore(store))
		truth.Advance(10 * time.Minute)
		a := oneAttemptClient(t, device, &http.Client{Transport: net}, idem.WithStore(store))
		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		net.holdNext(1)
		_, err = a.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		device.setWall(time.Hour) // the user sets the clock an hour forward
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a's attempt may still be on its way")
		net.deliver(t)
		assert.Equal(t, 1, srv.Stats().Payments)
		assert.NotEqual(t, persist.StateVoid, loaded.State(), "the intent reads void while its payment was made")
	})

	t.Run("a payment it finds but cannot record is returned marked not recorded", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		store := &dyingStore{Store: persist.NewMemory(nil)}
		c := e.newClient(t, idem.WithStore(store), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		store.dead.Store(true)
		resp, err := c.Reconcile(ctx, in)
		require.ErrorAs(t, err, new(*idem.SaveError))
		require.NotNil(t, resp, "the server's answer is shown")
		assert.True(t, resp.NotRecorded, "a storage error with an answer not marked reads as nothing sent")
		assert.False(t, in.State().Resolved())
	})

	t.Run("a miss after the holder died while resuming, seen by another Client, never voids", func(t *testing.T) {
		t.Parallel()
		clk, srv, net := heldWorld(t)
		disk := persist.NewMemory(nil)
		store := &dyingStore{Store: disk}
		// b, the second Client on the device, started with the app.
		b := oneAttemptClient(t, clk, srv.Client(), idem.WithStore(disk))
		a := oneAttemptClient(t, clk, &http.Client{Transport: store.sending(net)}, idem.WithStore(store))
		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		net.holdNext(1) // the first send is lost in transit for good
		_, err = a.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		clk.Advance(time.Hour) // the first send's reconcile delay is long past

		net.holdNext(1)             // the resumed request is held in transit
		store.dieOnSend.Store(true) // and a dies as it goes out
		_, err = a.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		clk.Advance(time.Second)
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a's resumed request may still be on its way")
		assert.False(t, loaded.State().Resolved())

		net.deliver(t) // the resumed request arrives: the server charges
		clk.Advance(2*time.Minute + reconcileDelay)
		_, err = b.Reconcile(ctx, loaded)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, loaded.State(), "found, not void")
		assert.Equal(t, 1, srv.Stats().Payments)
	})

	t.Run("a miss while another Client's send may still arrive never voids", func(t *testing.T) {
		t.Parallel()
		clk, srv, net := heldWorld(t)
		store := persist.NewMemory(nil)
		// b, the second Client on the device, started long before a sends.
		b := oneAttemptClient(t, clk, srv.Client(), idem.WithStore(store))
		clk.Advance(reconcileDelay + time.Minute)

		a := oneAttemptClient(t, clk, &http.Client{Transport: net}, idem.WithStore(store))
		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		net.holdNext(1) // a's request is held in transit
		_, err = a.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		clk.Advance(time.Second)
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a's request may still be on its way")
		assert.False(t, loaded.State().Resolved())

		net.deliver(t) // the held request arrives: the server charges
		clk.Advance(2*time.Minute + reconcileDelay)
		_, err = b.Reconcile(ctx, loaded)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, loaded.State(), "found, not void")
		assert.Equal(t, 1, srv.Stats().Payments)
	})

	t.Run("it finds a payment whose answer was lost", func(t *testing.T) {
		t.Parallel()
		resp, _ := reconcileLostAnswer(t, "checkout:reconcile")
		assert.Equal(t, 1500, decodePayment(t, resp.Body).Amount)
	})

	// A payment found by Reconcile is the intent's stored answer from then on,
	// and the caller's copy is its own.
	t.Run("the payment it finds is the intent's stored answer", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in := e.newIntent(t, "checkout:found", 100)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
		_, err := e.client.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		resp, err := e.client.Reconcile(ctx, in)
		require.NoError(t, err)
		want := bytes.Clone(resp.Body)
		resp.Body[0] = 'X'
		resp.Header.Set("Content-Type", "text/plain")

		require.NotNil(t, in.Response())
		assert.Equal(t, want, in.Response().Body)
		again, err := e.client.Do(ctx, in)
		require.NoError(t, err)
		assert.True(t, again.FromStore)
		assert.Equal(t, want, again.Body)
		assert.Equal(t, "application/json", again.Header.Get("Content-Type"))
	})

	t.Run("a miss is trusted only once no attempt can still arrive", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()

		t.Run("first attempt never recorded, then a restart", func(t *testing.T) {
			t.Parallel()
			clk, srv, net := heldWorld(t)
			disk := persist.NewMemory(nil)
			store := &dyingStore{Store: disk}
			before := oneAttemptClient(t, clk, &http.Client{Transport: store.sending(net)}, idem.WithStore(store))
			in, err := before.Intent(ctx, "checkout", payment1500(t, srv))
			require.NoError(t, err)
			require.NoError(t, idem.Arm(before, ctx, in))

			clk.Advance(10 * time.Minute) // sent ten minutes after it was created, through a slow uplink
			net.holdNext(1)
			store.dieOnSend.Store(true) // and the process dies before it records anything
			_, err = before.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

			after := oneAttemptClient(t, clk, srv.Client(), idem.WithStore(disk))
			loaded, err := after.Load(ctx, in.Key())
			require.NoError(t, err)
			stored, err := disk.Get(ctx, in.Key())
			require.NoError(t, err)
			require.Equal(t, persist.StateNew, stored.State, "the attempt was never recorded")
			require.Equal(t, persist.StatePending, loaded.State(), "yet it may have been sent")
			_, err = after.Reconcile(ctx, loaded)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the dead process's attempt may still be on its way")
			assert.False(t, loaded.State().Resolved())

			net.deliver(t) // the held request arrives: the server charges
			clk.Advance(reconcileDelay)
			_, err = after.Reconcile(ctx, loaded)
			require.NoError(t, err)
			assert.Equal(t, persist.StateSucceeded, loaded.State(), "found, not void")
			assert.Equal(t, 1, srv.Stats().Payments)
		})

		t.Run("attempt just before expiry", func(t *testing.T) {
			t.Parallel()
			clk, srv, net := heldWorld(t)
			c := oneAttemptClient(t, clk, &http.Client{Transport: net})
			in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
			require.NoError(t, err)
			require.NoError(t, idem.Arm(c, ctx, in))

			clk.Advance(sendWindow - time.Second)
			net.holdNext(1)
			_, err = c.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			clk.Advance(2 * time.Second) // now expired
			_, err = c.Do(ctx, in)
			requireStop(t, err, idem.StopExpired)

			_, err = c.Reconcile(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "expired, but its last attempt may still be on its way")
			assert.False(t, in.State().Resolved())

			net.deliver(t)
			clk.Advance(reconcileDelay)
			_, err = c.Reconcile(ctx, in)
			require.NoError(t, err)
			assert.Equal(t, persist.StateSucceeded, in.State())
			assert.Equal(t, 1, srv.Stats().Payments)
		})

		t.Run("an attempt that arrives while the lookup is on its way", func(t *testing.T) {
			t.Parallel()
			clk, srv, net := heldWorld(t)
			slow := &slowLookup{base: net, clock: clk, net: net, t: t}
			c := oneAttemptClient(t, clk, &http.Client{Transport: slow})
			in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
			require.NoError(t, err)
			net.holdNext(1)
			_, err = c.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

			// The lookup leaves a second before the delay is over; the server
			// answers 404; then, while the answer travels back, the held
			// attempt arrives, and the delay ends.
			clk.Advance(reconcileDelay - time.Second)
			_, err = c.Reconcile(ctx, in)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the 404 tells the server's state when the lookup left, when the attempt could still arrive")
			assert.NotEqual(t, persist.StateVoid, in.State())
			assert.Equal(t, 1, srv.Stats().Payments)
		})

		t.Run("never sent", func(t *testing.T) {
			t.Parallel()
			clk := clock.NewManual(epoch)
			srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
			t.Cleanup(srv.Close)
			c, err := idem.NewWith(idem.WithLookup(contractLookup), idem.WithClock(clk), idem.WithHTTPClient(srv.Client()))
			require.NoError(t, err)
			in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
			require.NoError(t, err)
			_, err = c.Reconcile(ctx, in)
			require.Error(t, err, "never armed: nothing to ask about")
			require.NoError(t, idem.Arm(c, ctx, in))
			_, err = c.Reconcile(ctx, in)
			require.NoError(t, err, "no attempt was ever made: nothing can arrive")
			assert.Equal(t, persist.StateVoid, in.State())
		})
	})

	t.Run("an early miss is never trusted", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in := e.newIntent(t, "checkout:early", 1500)
		// The connection breaks before the server reads the request: the
		// server has no record, yet from the client's side the attempt may
		// still be on its way.
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
		_, err := e.client.Do(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		_, err = e.client.Reconcile(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a 404 right after the attempt is not trusted")
		assert.Equal(t, persist.StatePending, in.State())

		e.clock.Advance(reconcileDelay)
		_, err = e.client.Reconcile(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateVoid, in.State())
		assert.Equal(t, 0, e.srv.Stats().ProviderCharges)
	})

	t.Run("a dead worker's charge is never voided", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in := e.newIntent(t, "checkout:dead", 1500)
		// The worker dies after the provider charged: no payment row yet.
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: in.Key()})
		_, err := e.client.Do(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		// While the dead worker's lease is alive the server cannot tell it
		// from a slow one: not settled.
		_, err = e.client.Reconcile(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "never void while the server holds the key")
		assert.Equal(t, persist.StatePending, in.State())

		// Once the lease has ended, the server's lookup asks the provider and
		// records the charge that was made: paid, charged once.
		e.clock.Advance(reconcileDelay)
		_, err = e.client.Reconcile(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, in.State())
		st := e.srv.Stats()
		assert.Equal(t, 1, st.ProviderCharges)
		assert.Equal(t, 1, st.Payments)
	})

	// The first tap charged and its answer was lost; a day later the intent is
	// too old to send again and Send asks the lookup, which an ingress answers
	// with its own page. Nothing changes, nobody pays twice, and once the
	// server itself answers the lookup the intent is the payment.
	t.Run("a proxy's 404 on the lookup never voids a payment that happened", func(t *testing.T) {
		t.Parallel()
		for _, stranger := range lookupStrangers {
			t.Run(stranger.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				var inFront atomic.Bool
				inFront.Store(true)
				f := newFront(t, func(w http.ResponseWriter, r *http.Request) bool {
					if isLookup(r) && inFront.Load() {
						stranger.answer(w, r)
						return true
					}
					return false
				})
				c := f.client(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
				req := f.payment(t, 1500)
				in, err := c.Intent(ctx, "checkout", req)
				require.NoError(t, err)
				require.NoError(t, f.origin.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
				_, err = c.Do(ctx, in)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				require.Equal(t, 1, f.origin.Stats().Payments)

				f.clock.Advance(sendWindow)
				_, err = c.Send(ctx, "checkout", req)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the stranger's answer cannot tell")
				stored, err := c.Load(ctx, in.Key())
				require.NoError(t, err)
				assert.Equal(t, persist.StateExpired, stored.State(), "nothing changes")
				assert.Equal(t, 1, f.origin.Stats().Payments, "nobody pays twice")

				inFront.Store(false)
				resp, err := c.Send(ctx, "checkout", req)
				require.NoError(t, err)
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, in.Key(), resp.Header.Get("Idempotency-Key"))
				assert.Equal(t, 1, f.origin.Stats().Payments)
			})
		}
	})

	t.Run("an unavailable server leaves the outcome unknown", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in := e.newIntent(t, "checkout:busy", 1500)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
		_, err := e.client.Do(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		e.clock.Advance(reconcileDelay)

		// A proxy in front of the server cannot answer now: not settled.
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, RetryAfter: "1"})
		_, err = e.client.Reconcile(context.Background(), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		var apiErr *idem.APIError
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, http.StatusServiceUnavailable, apiErr.StatusCode)
		assert.Equal(t, persist.StatePending, in.State())
	})

	t.Run("it holds the intent against Do", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		gate := &gateStore{Store: e.store, armed: make(chan struct{}), release: make(chan struct{})}
		c := e.newClient(t, idem.WithStore(gate), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in, err := c.NewIntent(ctx, "checkout:hold", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultReset, Key: in.Key()})
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		e.clock.Advance(reconcileDelay)

		gate.mu.Lock()
		gate.on = true
		gate.mu.Unlock()
		reconciled := make(chan error, 1)
		go func() {
			_, err := c.Reconcile(ctx, in)
			reconciled <- err
		}()
		<-gate.armed // Reconcile is inside the store, holding the intent
		done := make(chan error, 1)
		go func() {
			_, err := c.Do(ctx, in)
			done <- err
		}()
		// The Do cannot finish while Reconcile holds the key; Forget is refused.
		require.ErrorIs(t, c.Forget(ctx, in), idem.ErrInFlight)
		close(gate.release)
		require.NoError(t, <-reconciled)
		assert.Equal(t, persist.StateVoid, in.State())

		// Then the Do runs on its own and finds the intent settled: it sends
		// nothing, so the void stays true.
		require.Error(t, <-done)
		assert.Equal(t, persist.StateVoid, in.State())
		assert.Equal(t, 0, e.srv.Stats().ProviderCharges)
		assert.Equal(t, 0, e.srv.Stats().Executions)
	})

	t.Run("it saves after a cancel", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in := e.newIntent(t, "checkout:reconcile-cancel", 100)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
		_, err := e.client.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		c := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: cancelAfterAnswer{e.srv.Client().Transport, cancel}}))
		_, err = c.Reconcile(ctx, in)
		require.NoError(t, err)
		rec, err := e.store.Get(context.Background(), in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, rec.State)
	})

	t.Run("a void that was not saved is not reported", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			writeKeyUnused(w, r)
		}))
		t.Cleanup(srv.Close)
		clk := clock.NewManual(epoch)
		store := &dyingStore{Store: persist.NewMemory(nil)}
		c, err := idem.NewWith(idem.WithClock(clk), idem.WithStore(store), idem.WithLookup(contractLookup),
			idem.WithHTTPClient(srv.Client()), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		clk.Advance(reconcileDelay)

		store.dead.Store(true)
		_, err = c.Reconcile(ctx, in)
		var saveErr *idem.SaveError
		require.ErrorAs(t, err, &saveErr)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a storage error alone reads as nothing sent")
		assert.NotEqual(t, persist.StateVoid, in.State(),
			"the store still holds the intent unresolved and would send it again: an app told void could pay twice")
		assert.False(t, in.State().Resolved())
	})
	// The fake lookup asked of every intent answers the order made.
	t.Run("an order whose answer was lost is never voided", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
		var orders atomic.Int32
		createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			orders.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ord_1"}`)
		})
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk,
			Endpoints: []fakeserver.Endpoint{{Pattern: "POST /orders", Handler: createOrder}}})
		t.Cleanup(srv.Close)

		store, err := persist.OpenDir(filepath.Join(t.TempDir(), "intents"), nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = store.Close() })
		client, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Clock: clk,
			RetryPolicy: idem.RetryPolicy{MaxAttempts: 1},
			Server: idem.Server{Mark: idem.MarkEcho, Lookup: func(_ idem.Request, key string) string {
				return srv.URL + "/payments?idempotency_key=" + key
			}}})
		require.NoError(t, err)

		ctx := context.Background()
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/orders", map[string]any{"sku": "tea"})
		require.NoError(t, err)
		in, err := client.Intent(ctx, "order:cart-7", req)
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
		_, err = client.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.Equal(t, int32(1), orders.Load())

		clk.Advance(10 * time.Minute) // past the reconcile delay and the lease
		resp, err := client.Reconcile(ctx, in)
		if resp != nil {
			t.Logf("lookup answered %d %s", resp.StatusCode, resp.Body)
		}
		t.Logf("Reconcile: state %s, err %v", in.State(), err)
		require.NotEqual(t, persist.StateVoid, in.State(),
			"the order was made under %s, and the client was told nothing was", in.Key())
	})
	// A box in front echoes neither the key nor the nonce.
	t.Run("a status rule's server-like answers never settle the intent", func(t *testing.T) {
		t.Parallel()
		store, _ := storeDir(t, nil)
		clk, srv, client := echoClient(t, store)
		ctx := context.Background()
		in, err := client.Intent(ctx, "checkout:cart-9", payment1500(t, srv))
		require.NoError(t, err)

		require.NoError(t, srv.InjectRule(&fault.Rule{When: fault.Method(http.MethodPost), Times: 1, Effect: fault.Effect{
			Kind: fakeserver.FaultStatus, Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_forged"}},
			Body:   []byte(`{"id":"pay_forged","amount":1500,"currency":"AZN","customer":"cus_1","status":"succeeded"}`)}}))
		_, err = client.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		require.NoError(t, srv.InjectRule(&fault.Rule{When: fault.Query("idempotency_key"), Times: 1, Effect: fault.Effect{
			Kind: fakeserver.FaultStatus, Status: http.StatusNotFound,
			Header: http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}},
			Body:   []byte(`{"type":"https://idem.dev/problems/idempotency-key-unused","title":"Idempotency-Key unused","status":404}`)}}))
		clk.Advance(10 * time.Minute)
		_, err = client.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.False(t, in.State().Resolved(), "state %s", in.State())

		resp, err := client.Do(ctx, in)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, 1, srv.Stats().ProviderCharges)
	})

	// Client A arms the intent (its claim: no send begins past
	// arm+MaxElapsed+5s), its first attempt gets a 503, and the phone sleeps
	// during the backoff. Go's monotonic clock, the budget's, stops. Meanwhile
	// Client B on the same store sees the send deadline plus ReconcileDelay
	// pass on every clock, gets the lookup's typed miss and voids the
	// intent. On waking, A's retry must not begin: the check just before the
	// wire reads the stored send deadline on the clock that counts sleep. So
	// the void stays true: nothing is charged.
	t.Run("a void stays true when the sender's phone sleeps in a backoff past its send deadline", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv, store := phoneStore(t)
		server := echoLookupServer

		phone := &goClock{m: truth}
		a, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: phone,
			OnAttempt:   func(at idem.Attempt) { t.Logf("A's attempt %d: %d", at.Number, at.StatusCode) },
			RetryPolicy: idem.RetryPolicy{MaxAttempts: 3, MaxElapsed: 30 * time.Second, InitialInterval: time.Second}})
		require.NoError(t, err)
		b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth})
		require.NoError(t, err)

		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, Key: in.Key()}))

		var voided bool
		phone.sleepFor = 10 * time.Minute
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
		// A sent nothing past the deadline, so B's void is the truth, and A
		// adopts it from the store.
		assert.Error(t, err)
		assert.Equal(t, persist.StateVoid, in.State(), "A tells the stored void, which is true: nothing was charged")
	})

	// Do arms the intent and reads the clocks once for the expiry check and
	// mustHold. The first attempt then asks Config.Authorizer for a token,
	// and the phone sleeps while it refreshes. Client B on the same store
	// voids the intent meanwhile (the send deadline plus ReconcileDelay
	// passed on every clock). The first attempt must not begin past the
	// stored send deadline, so the void stays true: nothing is charged.
	t.Run("a void stays true when the sender's phone sleeps in its Authorizer past its send deadline", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv, store := phoneStore(t)
		server := echoLookupServer

		b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth,
			Authorizer: func(context.Context, string) (string, error) { return "Bearer test_acme_1", nil }})
		require.NoError(t, err)
		phone := &goClock{m: truth}
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

		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		key = in.Key()
		resp, err := a.Do(ctx, in)
		t.Logf("A's Do: resp %v, err %v, state %s", resp != nil, err, in.State())

		charged := srv.Stats().ProviderCharges
		require.True(t, voided, "the setup: B voided the intent while A's phone slept")
		assert.Zero(t, charged, "B told the app the intent is void, but A's first attempt, begun past its stored send deadline, charged the card")
		// The cut attempt writes nothing. A tells no more than it knows: the
		// outcome is unknown until a later Do or Settle reads the store.
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	})

	// A's POST is held past every bound. Client C starts Reconcile. While
	// C's lookup is on its way, B voids the intent from the server's typed
	// miss, then the held POST lands and the server charges. C's lookup
	// gets the server's word that it was paid. That is newer than the void,
	// and is written over it: a later Settle never tells void, and the
	// action is never paid twice.
	// A gateway copies the request's header fields into its own 200 JSON,
	// the lookup's nonce among them. The lookup carries a second nonce that
	// no server sends back (Idempotency-Attempt-Nonce), so the copy is seen
	// for what it is, and settles nothing.
	t.Run("an echoing gateway's 200 never settles an intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		front := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				// The connection breaks before the server is reached.
				conn, _, err := rw.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			}
			// An echoing gateway: it reflects the request's header fields.
			for name, vs := range r.Header {
				rw.Header()[name] = vs
			}
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusOK)
			_, _ = rw.Write([]byte(`{"id":"gw_echo_1","path":"` + r.URL.Path + `"}`))
		}))
		t.Cleanup(front.Close)
		c, err := idem.New(idem.Config{Store: dirStore(t, filepath.Join(t.TempDir(), "store")), HTTPClient: front.Client(),
			Server: idem.Server{Mark: idem.MarkJSONID("id"), LookupQuery: "idempotency_key"}, Clock: truth,
			RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, front.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		t.Logf("Do: err %v, state %s", err, in.State())
		require.Error(t, err)
		truth.Advance(time.Hour)
		_, err = c.Reconcile(ctx, in)
		t.Logf("Reconcile: err %v, state %s", err, in.State())
		require.Equal(t, 0, srv.Stats().ProviderCharges, "the setup: nothing reached the server")
		assert.NotEqual(t, persist.StateSucceeded, in.State(), "an echoing gateway's 200 settled the intent succeeded; the server has no payment")
	})

	// B's lookup is held by an echoing gateway while A's lookup gets the
	// server's typed miss and stores a true void. The gateway's copy then
	// reaches B. It is no server's word, so it never writes over the void.
	t.Run("a true void is never written over by an echoing gateway's 200", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		target, err := url.Parse(srv.URL)
		require.NoError(t, err)
		proxy := httputil.NewSingleHostReverseProxy(target)
		var gets atomic.Int32
		held, release := make(chan struct{}), make(chan struct{})
		front := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				if conn, _, err := rw.(http.Hijacker).Hijack(); err == nil {
					conn.Close()
				}
				return
			}
			if gets.Add(1) != 1 {
				proxy.ServeHTTP(rw, r)
				return
			}
			close(held)
			<-release
			for name, vs := range r.Header {
				rw.Header()[name] = vs
			}
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusOK)
			_, _ = rw.Write([]byte(`{"id":"gw_echo_1"}`))
		}))
		t.Cleanup(front.Close)
		disk := dirStore(t, filepath.Join(t.TempDir(), "store"))
		t.Cleanup(func() { disk.Close() })
		server := idem.Server{Mark: idem.MarkJSONID("id"), LookupQuery: "idempotency_key"}
		a, err := idem.New(idem.Config{Store: disk, HTTPClient: front.Client(), Server: server, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		b, err := idem.New(idem.Config{Store: disk, HTTPClient: front.Client(), Server: server, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, front.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := a.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = a.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the setup: the POST died on its way")
		truth.Advance(time.Hour)

		bIn, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		bDone := make(chan error, 1)
		go func() { _, err := b.Reconcile(ctx, bIn); bDone <- err }()
		<-held
		_, err = a.Reconcile(ctx, in)
		t.Logf("A's Reconcile: err %v, state %s", err, in.State())
		require.Equal(t, persist.StateVoid, in.State(), "the setup: A trusted the server's typed miss (true)")
		close(release)
		err = <-bDone
		t.Logf("B's Reconcile: err %v, state %s", err, bIn.State())
		require.Equal(t, 0, srv.Stats().ProviderCharges, "nothing was charged")
		later, err := a.Load(ctx, in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateVoid, later.State(), "a true void was written over by a gateway's 200")
	})

	// The same, on a full disk: C cannot write the server's word over the
	// void. C then never tells the void. Its next Load writes the word over
	// it, once the disk has room again.
	for _, tc := range []struct {
		name     string
		diskFull bool
	}{
		{"a lookup's answer wins over a void stored while it was on its way", false},
		{"a lookup's answer that cannot be written over a void stored meanwhile is never told void", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			truth, srv, store := phoneStore(t)
			proxy := proxyTo(t, srv)
			cStore := &flakyWrites{Store: store}

			var (
				b                      *idem.Client
				held, release, charged = make(chan struct{}), make(chan struct{}), make(chan struct{})
				lookupOnce             sync.Once
				first                  atomic.Bool
				bState                 persist.State
				bErr                   error
			)
			first.Store(true)
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.Method == http.MethodPost && first.CompareAndSwap(true, false):
					close(held)
					<-release
					// The held POST lands; the server charges; A's answer is lost.
					proxy.ServeHTTP(httptest.NewRecorder(), r)
					close(charged)
					panic(http.ErrAbortHandler)
				case r.Header.Get("X-Rt-Who") == "C":
					lookupOnce.Do(func() {
						// While C's lookup is on its way: B voids from the
						// server's typed miss, then the held POST lands.
						loaded, err := b.Load(ctx, r.URL.Query().Get("idempotency_key"))
						if err == nil {
							_, bErr = b.Reconcile(ctx, loaded)
							bState = loaded.State()
						} else {
							bErr = err
						}
						close(release)
						<-charged
						if tc.diskFull {
							cStore.failAt = 2 // the first write meets the void; the second is overVoid's
							cStore.armed.Store(true)
						}
					})
					proxy.ServeHTTP(w, r)
				default:
					proxy.ServeHTTP(w, r)
				}
			}))
			t.Cleanup(front.Close)

			var err error
			b, err = idem.New(idem.Config{Store: store, HTTPClient: front.Client(), Server: echoLookupServer, Clock: truth})
			require.NoError(t, err)
			cTransport := front.Client().Transport
			cc, err := idem.New(idem.Config{Store: cStore, Server: echoLookupServer, Clock: truth,
				HTTPClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					r = r.Clone(r.Context())
					r.Header.Set("X-Rt-Who", "C")
					return cTransport.RoundTrip(r)
				})}})
			require.NoError(t, err)
			a, err := idem.New(idem.Config{Store: store, Server: echoLookupServer, Clock: truth,
				HTTPClient:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
				RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
			require.NoError(t, err)

			req := payment1500(t, srv)
			req.URL = front.URL + "/payments"
			in, err := a.Intent(ctx, "checkout", req)
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				_, err := a.Do(ctx, in)
				done <- err
			}()
			<-held
			truth.Advance(time.Hour) // the POST is held past every bound

			cin, err := cc.Load(ctx, in.Key())
			require.NoError(t, err)
			resp, recErr := cc.Reconcile(ctx, cin)
			aErr := <-done
			t.Logf("B's reconcile: state %s, err %v", bState, bErr)
			t.Logf("A's Do: err %v", aErr)
			t.Logf("C's Reconcile: resp %v, err %v, state %s", resp != nil, recErr, cin.State())
			require.Equal(t, persist.StateVoid, bState, "the setup: B trusted the server's typed miss")
			require.Equal(t, 1, srv.Stats().ProviderCharges, "the setup: the held POST was charged")
			require.NotNil(t, resp, "the setup: C's lookup got the server's answer")
			require.Equal(t, http.StatusOK, resp.StatusCode)

			if !tc.diskFull {
				stored, err := b.Load(ctx, in.Key())
				require.NoError(t, err)
				assert.NotEqual(t, persist.StateVoid, stored.State(), "C held the server's word that it was paid, yet the void stays stored")
			} else {
				require.ErrorIs(t, recErr, idem.ErrOutcomeUnknown, "the setup: C could not write the server's word over the void")
			}

			// Later, C settles the intent: told void, though C held the server's
			// 2xx for its key. The app's Send trusts it and pays again.
			later, err := cc.Load(ctx, in.Key())
			require.NoError(t, err)
			_, err = cc.Settle(ctx, later)
			t.Logf("C's Settle: err %v, state %s", err, later.State())
			assert.NotEqual(t, persist.StateVoid, later.State(), "Settle tells void for a payment whose 2xx C held")
			_, err = cc.Send(ctx, "checkout", req)
			t.Logf("C's Send: err %v", err)
			assert.Equal(t, 1, srv.Stats().ProviderCharges, "the user's one action is charged twice")
		})
	}

	// A's first attempt begins in time, and the phone sleeps an hour while
	// its connection is dialing. The attempt's context is a Go timer, which
	// stops while the phone sleeps. On waking, B voids the intent (the send
	// deadline plus ReconcileDelay passed on the clock that counts sleep),
	// and the app pays the changed cart under a new intent. A's dial then
	// completes. Its request must not be written: the body's first read
	// checks the send deadline on a fresh reading (sendGate).
	t.Run("a void stays true when the sender's phone sleeps mid-dial past its send deadline", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newSleepWorld(t, echoLookupServer, nil)
		srv := w.srv
		dialing := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPost {
				w.sleep(t) // once: the first POST's dial spans the sleep
			}
			return srv.Client().Transport.RoundTrip(req)
		})
		a := w.clientA(t, &http.Client{Transport: dialing}, echoLookupServer)
		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		w.key = in.Key()
		resp, err := a.Do(ctx, in)
		t.Logf("A's Do: resp %v, err %v, state %s", resp != nil, err, in.State())
		require.True(t, w.voided, "the setup: B voided the intent on waking")
		require.NoError(t, w.paid, "the setup: told void, the app paid the changed cart")

		assert.Equal(t, 1, srv.Stats().ProviderCharges, "A's request went out an hour past its send deadline, after B's void: two charges for one checkout")
		// A's request was never written whole, so B's void is the truth.
		// A adopts it from the store.
		assert.Error(t, err)
		assert.Equal(t, persist.StateVoid, in.State())
	})
}

// slowDisk is a real FileStore on a slow disk: the next write, once
// slowNext is set, takes that long on the device's clocks (an fsync
// stalled behind other I/O, as phones' flash does for seconds). After the
// process dies (dead), no write reaches the disk.
type slowDisk struct {
	persist.Store
	clk      *clock.Manual
	slowNext atomic.Int64
	dead     atomic.Bool
}

func (s *slowDisk) Write(ctx context.Context, r, old *persist.Record) error {
	if s.dead.Load() {
		return context.Canceled // the process is gone: nothing reaches the disk
	}
	if d := s.slowNext.Swap(0); d > 0 {
		s.clk.Advance(time.Duration(d))
	}
	return s.Store.Write(ctx, r, old)
}

// killingNetwork is the device's network: the n-th POST from now (holdAt) is held
// in transit, and the app's process is killed as it goes out (nothing
// after it is recorded). deliver lets it reach the server later.
type killingNetwork struct {
	store *slowDisk
	mu    sync.Mutex
	left  int
	held  *heldNetwork
}

func (n *killingNetwork) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost {
		n.mu.Lock()
		if n.left > 0 {
			n.left--
			if n.left == 0 {
				if n.store != nil {
					n.store.dead.Store(true)
				}
				n.held.holdNext(1)
			}
		}
		n.mu.Unlock()
	}
	return n.held.RoundTrip(r)
}

func (n *killingNetwork) holdAt(count int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.left = count
}

// noBootClock is a device whose system has no clock that counts sleep
// (Windows, the BSDs, a sandbox that hides the boot's identity: what
// clock.System reports there): the wall clock, which the user or a bad
// network time may set, and the in-process monotonic clock. It runs on m,
// the true time the server shares.
type noBootClock struct {
	clock.NoBoot
	m      *clock.Manual
	mu     sync.Mutex
	offset time.Duration
}

func (c *noBootClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Now().Add(c.offset)
}

func (c *noBootClock) Sleep(ctx context.Context, d time.Duration) error { return c.m.Sleep(ctx, d) }

func (c *noBootClock) Monotonic() time.Duration { return c.m.Monotonic() }

// setWall moves the wall clock alone, as a setting of the time does.
func (c *noBootClock) setWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// gatedClock is a device's clocks for one Client whose waits the test
// paces: Sleep reports the wait, then returns once the test, having moved
// the true clock on by at least that much, releases it.
type gatedClock struct {
	m        *clock.Manual
	sleeping chan time.Duration
	release  chan struct{}
}

func (c *gatedClock) Now() time.Time { return c.m.Now() }

func (c *gatedClock) Monotonic() time.Duration { return c.m.Monotonic() }

func (c *gatedClock) SinceBoot() (time.Duration, string, bool) { return c.m.SinceBoot() }

func (c *gatedClock) Sleep(ctx context.Context, d time.Duration) error {
	c.sleeping <- d
	select {
	case <-c.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sharedDevice is the world of the red-team paths below. The server keeps
// the true time. The device's Clients share one file store, and the
// server's lookup and reconcile delay.
type sharedDevice struct {
	truth  *clock.Manual
	srv    *fakeserver.Server
	fs     *persist.FileStore
	server idem.Server
}

func newSharedDevice(t *testing.T) *sharedDevice {
	t.Helper()
	truth := clock.NewManual(epoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	fs, err := persist.OpenDir(filepath.Join(t.TempDir(), "idem"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { fs.Close() })
	return &sharedDevice{truth: truth, srv: srv, fs: fs,
		server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key", ReconcileDelay: reconcileDelay}}
}

// client is a Client of the device on store and hc, with clk and policy.
func (d *sharedDevice) client(t *testing.T, store persist.Store, hc *http.Client, clk clock.Clock, policy idem.RetryPolicy) *idem.Client {
	t.Helper()
	c, err := idem.New(idem.Config{Store: store, HTTPClient: hc, Clock: clk, Server: d.server, RetryPolicy: policy})
	require.NoError(t, err)
	return c
}

// dying returns the disk and the network of a Client whose process dies
// as a held request goes out: a slow disk on the shared store, and a
// network that holds that request and stops the disk.
func (d *sharedDevice) dying() (*slowDisk, *killingNetwork) {
	disk := &slowDisk{Store: d.fs, clk: d.truth}
	return disk, &killingNetwork{store: disk, held: &heldNetwork{base: d.srv.Client().Transport}}
}

// patient returns Client b of the take-over paths, and its clock: a
// background settle with a 30-minute budget, whose waits the test paces.
func (d *sharedDevice) patient(t *testing.T) (*idem.Client, *gatedClock) {
	t.Helper()
	clk := &gatedClock{m: d.truth, sleeping: make(chan time.Duration), release: make(chan struct{})}
	policy := idem.RetryPolicy{MaxElapsed: 30 * time.Minute, MaxRetryAfter: 5 * time.Minute, Jitter: -1}
	return d.client(t, d.fs, d.srv.Client(), clk, policy), clk
}

// noBootPair returns the two Clients of the clock-set-back paths, on a
// device with no clock that counts sleep: b on the shared store, and a on
// the dying disk and network. Each makes one attempt a call.
func (d *sharedDevice) noBootPair(t *testing.T) (device *noBootClock, a, b *idem.Client, net *killingNetwork) {
	t.Helper()
	device = &noBootClock{m: d.truth}
	disk, net := d.dying()
	policy := idem.RetryPolicy{MaxAttempts: 1}
	b = d.client(t, d.fs, d.srv.Client(), device, policy)
	a = d.client(t, disk, &http.Client{Transport: net}, device, policy)
	return device, a, b, net
}

// waitingOn starts the patient Client b's call of in, which a gateway
// answers 503 with Retry-After: retryAfter, twice. It returns once b
// waits to retry: how long b waits, and where b's call will end.
func (d *sharedDevice) waitingOn(t *testing.T, b *idem.Client, bClock *gatedClock, in *idem.Intent, retryAfter string) (time.Duration, <-chan error) {
	t.Helper()
	require.NoError(t, d.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: 503, RetryAfter: retryAfter, Count: 2}))
	done := make(chan error, 1)
	go func() {
		_, err := b.Do(context.Background(), in)
		done <- err
	}()
	return <-bClock.sleeping, done
}

// reconcileAfterASlowResumeWrite: a holder resumes an intent long past
// its send deadline and writes a later one first (hold), read from the
// clocks before a write that stalls 12 s on a slow disk. Its budget starts
// after the write, and a 503's Retry-After puts its second attempt past
// the deadline it stored. That attempt is not sent (sendDeadline): had it
// been, and the app died with it in transit, another Client would trust
// the lookup's miss while it could still arrive.
func reconcileAfterASlowResumeWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSharedDevice(t)
	clk, srv := d.truth, d.srv
	disk, net := d.dying()

	// b, the second Client on the device, started with the app.
	b := d.client(t, d.fs, srv.Client(), clk, idem.RetryPolicy{MaxAttempts: 1})
	a := d.client(t, disk, &http.Client{Transport: net}, clk,
		idem.RetryPolicy{MaxAttempts: 2, MaxElapsed: 30 * time.Second, Jitter: -1})

	in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
	require.NoError(t, err)
	// The first send is cut before the server reads it, twice: unknown.
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultReset, Path: "/payments", Count: 2}))
	_, err = a.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 0, srv.Stats().Payments)
	clk.Advance(time.Hour) // the first send's reconcile delay is long past

	// a resumes: a proxy answers its first attempt 503 with Retry-After,
	// its second is held in transit, and the app is killed as it leaves.
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 503, RetryAfter: "28", Path: "/payments", Count: 1}))
	disk.slowNext.Store(int64(12 * time.Second)) // the resume write stalls 12 s
	net.holdAt(2)
	resumedAt := clk.Now()
	_, err = a.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	sentAt := clk.Now()
	t.Logf("resume began %s, late attempt written %s after it", resumedAt.Format(time.TimeOnly), sentAt.Sub(resumedAt))

	// The budget stops at the deadline the resume stored: the late
	// attempt is not sent, and the lookup's miss that voids the intent
	// once that deadline and the reconcile delay passed is true.
	clk.Advance(reconcileDelay + time.Minute)
	loaded, err := b.Load(ctx, in.Key())
	require.NoError(t, err)
	_, err = b.Reconcile(ctx, loaded)
	require.NoError(t, err)
	net.held.deliver(t)
	assert.Equal(t, 0, srv.Stats().Payments, "no attempt was sent past the deadline the resume stored")
	assert.Equal(t, persist.StateVoid, loaded.State())
}

// reconcileAfterAResumeUnderAClockSetBack holds a path a red-team pass found, which had
// charged twice or told the app a false outcome.
//
// Path: Client a arms and sends an intent; the send is lost. An hour
// later the wall clock is set back two hours (a bad network time) and a
// resumes the intent. mustHold asks sendByLeft, which reads the wall
// clock alone here (no boot clock): the stored deadline looks two hours
// away, so a writes no later deadline (no "resume" hold), though the
// Client has seen the wall clock an hour past it (its high-water mark)
// and its monotonic clock says so too. a's request is held in transit and
// the app is killed as it goes out. The wall clock is then put right;
// Client b, started with the app, reconciles a minute later: the stored
// deadline is an hour past on every clock, so the lookup's miss voids
// the intent, and the held request then charges the card.
func reconcileAfterAResumeUnderAClockSetBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSharedDevice(t)
	truth, srv := d.truth, d.srv
	device, a, b, net := d.noBootPair(t)

	in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultReset, Path: "/payments", Count: 1}))
	_, err = a.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	truth.Advance(time.Hour)
	_, err = a.Unresolved(ctx) // a sees the wall clock an hour on
	require.NoError(t, err)

	device.setWall(-2 * time.Hour) // a bad network time
	net.holdAt(1)                  // the resumed request is held in transit; the app is killed
	_, err = a.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	sentAt := truth.Now()

	device.setWall(2 * time.Hour) // the time is put right
	truth.Advance(time.Minute)
	loaded, err := b.Load(ctx, in.Key())
	require.NoError(t, err)
	_, err = b.Reconcile(ctx, loaded)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a's resumed request, written %s ago, may still be on its way", truth.Now().Sub(sentAt))

	net.held.deliver(t)
	assert.Equal(t, 1, srv.Stats().Payments)
	assert.NotEqual(t, persist.StateVoid, loaded.State(), "the intent reads void while its payment was made")
}

// reconcileAfterATapUnderAClockSetBack holds a path a red-team pass found, which had
// charged twice or told the app a false outcome.
//
// Path: both Clients have seen the right time. The wall clock is then set
// back two hours (a bad network time) and the user taps Pay on a: the
// arming write stores its send deadline on the wall clock alone (sendBy:
// no boot clock), two hours in the past in truth, though a's high-water
// mark and monotonic clock know better. The request is held in transit
// and the app is killed. The time is put right; b reconciles a minute
// later: the stored deadline is two hours past, so the lookup's miss
// voids the intent, and the held request then charges the card.
func reconcileAfterATapUnderAClockSetBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSharedDevice(t)
	truth, srv := d.truth, d.srv
	device, a, b, net := d.noBootPair(t)
	truth.Advance(time.Hour) // the app has run an hour
	_, err := a.Unresolved(ctx)
	require.NoError(t, err)

	device.setWall(-2 * time.Hour) // a bad network time
	net.holdAt(1)                  // the tap's request is held in transit; the app is killed
	_, err = a.Send(ctx, "checkout", payment1500(t, srv))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	sentAt := truth.Now()
	pending, err := b.Unresolved(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 1)

	device.setWall(2 * time.Hour) // the time is put right
	truth.Advance(time.Minute)
	loaded := pending[0]
	_, err = b.Reconcile(ctx, loaded)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a's request, written %s ago, may still be on its way", truth.Now().Sub(sentAt))

	net.held.deliver(t)
	assert.Equal(t, 1, srv.Stats().Payments)
	assert.NotEqual(t, persist.StateVoid, loaded.State(), "the intent reads void while its payment was made")
}

// reconcileAfterATakeOver holds a path a red-team pass found, which had
// charged twice or told the app a false outcome.
//
// Path: Client b (a background settle with a long budget, as SettleAll's
// docs advise) sends an intent; a gateway answers 503 with Retry-After:
// 150 and b waits to retry. Meanwhile the user retries on Client a: a
// takes the intent over (hold, op "take over": holder a, a's own send
// deadline), gets the same 503, whose Retry-After is over a's cap, and its
// call ends at once. Two and a half minutes later a reconciles: it holds
// the record and its own last call ended more than the reconcile delay
// ago, so mayStillArrive says nothing can still arrive (the self-holder
// branch counts only a's own calls), and the lookup's miss voids the
// intent. b's call, which nothing told of the take-over, then retries:
// the server charges, and b's outcome write adopts the stored void. The
// card is charged, the intent reads void, and the app may pay again.
func reconcileAfterATakeOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSharedDevice(t)
	truth, srv := d.truth, d.srv
	b, bClock := d.patient(t)
	a := d.client(t, d.fs, srv.Client(), truth, idem.RetryPolicy{})

	in, err := b.Intent(ctx, "checkout", payment1500(t, srv))
	require.NoError(t, err)
	wait, bDone := d.waitingOn(t, b, bClock, in, "150")
	require.Equal(t, 150*time.Second, wait, "b waits 150 s to retry")

	twin, err := a.Load(ctx, in.Key())
	require.NoError(t, err)
	_, err = a.Do(ctx, twin) // the user retries on a: a takes it over
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 0, srv.Stats().Payments)

	truth.Advance(wait + time.Second)
	_, err = a.Reconcile(ctx, twin)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "b's call of the intent is still running")

	bClock.release <- struct{}{} // b's wait ends: it retries
	t.Logf("b's Do: err=%v; b's intent reads %s, a's %s", <-bDone, in.State(), twin.State())
	assert.Equal(t, 1, srv.Stats().Payments)
	assert.NotEqual(t, persist.StateVoid, twin.State(), "the intent reads void while its payment was made")
	assert.NotEqual(t, persist.StateVoid, in.State(), "b's app is told void while its payment was made")
}

// reconcileAfterATakeOverWithAShorterBudget holds a path a red-team pass found, which had
// charged twice or told the app a false outcome.
//
// Path: Client b sends an intent under a long budget (30 min: its arming
// write stores a send deadline 30 min on). A gateway answers 503 with
// Retry-After: 250 and b waits to retry. The user retries on Client a,
// whose budget is the default 2 min: a takes the intent over, and hold
// copies the stored clocks and then sets the send deadline to its own,
// now+2 min+5 s, overwriting b's later one. a's call ends at once (the
// Retry-After is over its cap). Client c reconciles once a's deadline and
// the reconcile delay have passed: the lookup's miss voids the intent,
// then b's call retries, well within the deadline it had stored, and the
// server charges.
func reconcileAfterATakeOverWithAShorterBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSharedDevice(t)
	truth, srv := d.truth, d.srv
	c := d.client(t, d.fs, srv.Client(), truth, idem.RetryPolicy{})
	b, bClock := d.patient(t)
	a := d.client(t, d.fs, srv.Client(), truth, idem.RetryPolicy{})

	in, err := b.Intent(ctx, "checkout", payment1500(t, srv))
	require.NoError(t, err)
	wait, bDone := d.waitingOn(t, b, bClock, in, "250")
	require.Equal(t, 250*time.Second, wait)

	twin, err := a.Load(ctx, in.Key())
	require.NoError(t, err)
	_, err = a.Do(ctx, twin) // a takes it over
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	truth.Advance(wait + time.Second) // past a's deadline and the reconcile delay
	seen, err := c.Load(ctx, in.Key())
	require.NoError(t, err)
	_, err = c.Reconcile(ctx, seen)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "b's call may still send under the deadline it stored")

	bClock.release <- struct{}{}
	<-bDone
	assert.Equal(t, 1, srv.Stats().Payments)
	assert.NotEqual(t, persist.StateVoid, seen.State(), "the intent reads void while its payment was made")
}

// TestReconcileAfterServerCrash: the server's worker charged the provider
// and died before recording anything.
func TestReconcileAfterServerCrash(t *testing.T) {
	t.Parallel()
	// The client's budget ran out before any attempt took the record
	// over. A void would make the app pay again under a new key; resuming
	// settles the intent with its one charge.
	t.Run("the provider's charge is found, never voided", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
		t.Cleanup(srv.Close)
		c, err := idem.NewWith(idem.WithLookup(contractLookup), idem.WithHTTPClient(srv.Client()), idem.WithClock(clk), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		ctx := context.Background()
		in, err := c.Intent(ctx, "checkout:orphan", req)
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: in.Key()}))

		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.Equal(t, 1, srv.Stats().ProviderCharges, "the provider charged")

		clk.Advance(reconcileDelay + time.Minute) // past the lease and the reconcile delay
		_, err = c.Reconcile(ctx, in)
		if err == nil {
			require.NotEqual(t, persist.StateVoid, in.State(), "the provider holds a charge for this intent, so it is not void")
		} else {
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "unsettled, not void")
			assert.False(t, in.State().Resolved())
			// Resuming with the same key makes the server recover the
			// dead worker's record: it finds the charge.
			resp, err := c.Do(ctx, in)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
		}
		assert.Equal(t, persist.StateSucceeded, in.State())
		stats := srv.Stats()
		assert.Equal(t, 1, stats.Payments)
		assert.Equal(t, 1, stats.ProviderCharges, "one user action, one charge")
	})
}
