package idem_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// handOut makes an intent on e's Client to pay 100, and hands its request
// out to the app.
func handOut(t *testing.T, e *env) (*idem.Intent, *http.Request) {
	t.Helper()
	ctx := context.Background()
	in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
	require.NoError(t, err)
	req, err := e.client.HTTPRequest(ctx, in)
	require.NoError(t, err)
	return in, req
}

func TestHTTPRequest(t *testing.T) {
	t.Parallel()
	t.Run("a request in the app's hands is never replaced by a changed cart nor voided by a lookup miss", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, req := handOut(t, e)
		assert.Equal(t, persist.StatePending, in.State(), "handed out, it may be sent")

		// The app's send is in transit; the user changes the cart.
		_, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorAs(t, err, new(*idem.UnresolvedError), "a changed cart never replaces it")
		// A restart, long past the reconcile delay: the lookup finds
		// nothing yet, and that is not trusted.
		e.clock.Advance(time.Hour)
		next := e.newClient(t)
		e.clock.Advance(3 * time.Minute) // past the delay from its birth too
		stored, err := next.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = next.Reconcile(ctx, stored)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "its request may still arrive")
		assert.NotEqual(t, persist.StateVoid, stored.State())

		// The request lands: one charge, and the intent settles on it.
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.NoError(t, next.SendEnded(ctx, stored))
		_, err = next.Settle(ctx, stored)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, stored.State())
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	t.Run("an intent too old to send is never handed out, paid or not", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		paid, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, paid)
		require.NoError(t, err)
		open, err := e.client.Intent(ctx, "tip", e.paymentRequest(t, 5, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.HTTPRequest(ctx, open)
		require.NoError(t, err) // handed out, never sent

		// A day later the server has forgotten both keys: either request
		// would be charged anew.
		e.clock.Advance(24 * time.Hour)
		req, err := e.client.HTTPRequest(ctx, paid)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.Equal(t, persist.StateSucceeded, paid.State())
		req, err = e.client.HTTPRequest(ctx, open)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Nil(t, req)
		assert.Equal(t, persist.StateExpired, open.State(), "it is settled through the lookup")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	// Path: one attempt, answered 503 by a proxy in front of the server:
	// the outcome is unknown, and the server has no record of the key. The
	// lookup's miss voids the intent, and the app pays anew. Handed out,
	// the void intent's request would be sent by the app's own
	// http.Client: the server, with no record of the key, charges again,
	// and the device still says void, since HTTPRequest's answers are not
	// recorded and a resolved intent is never reconciled again.
	t.Run("a void intent is never handed out", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		pay := e.paymentRequest(t, 1500, "cus_1")
		in, err := e.client.Intent(ctx, "checkout:cart-4", pay)
		require.NoError(t, err)
		require.NoError(t, e.srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Status: 503, Path: "/payments"}))
		_, err = e.client.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		e.clock.Advance(10 * time.Minute) // past the reconcile delay
		_, err = e.client.Reconcile(ctx, in)
		require.NoError(t, err)
		require.Equal(t, persist.StateVoid, in.State())
		// Told void, the app pays anew.
		again, err := e.client.NewIntent(ctx, "checkout:cart-4", pay)
		require.NoError(t, err)
		_, err = e.client.Do(ctx, again)
		require.NoError(t, err)

		req, err := e.client.HTTPRequest(ctx, in)
		require.Error(t, err, "the void intent's request would charge again")
		assert.Nil(t, req)
		assert.Contains(t, err.Error(), "create a new intent", "the error says what to do")
		assert.Equal(t, persist.StateVoid, in.State(), "nothing changes")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	t.Run("a failed intent is never handed out: the server may not have kept its refusal", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 1500, "cus_declined"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, in)
		require.Error(t, err)
		require.Equal(t, persist.StateFailed, in.State())
		req, err := e.client.HTTPRequest(ctx, in)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.Equal(t, persist.StateFailed, in.State())
	})
	t.Run("a paid intent is handed out: the server replays its answer", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, err := e.client.Intent(ctx, "checkout", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, in)
		require.NoError(t, err)
		req, err := e.client.HTTPRequest(ctx, in)
		require.NoError(t, err)
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	// Path: a tap ends not sent (offline), and the app asks for its
	// request a day later through HTTPRequest, to send it from its own
	// queue when the network is back. Handed out with its day-old
	// CreatedAt and clocks, the hand-out's protection ("reconciled as if
	// its request were still in transit, up to the server's retention")
	// would have run out already: a Reconcile a few minutes later would
	// take the lookup's miss and void the intent while the app still holds
	// the request; the app pays anew, then its queue sends the held
	// request: two charges, and the device says void.
	t.Run("a not-sent intent handed out a day later is never voided while held", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		clk, srv := e.clock, e.srv
		var offline atomic.Bool
		dialer := &net.Dialer{}
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if offline.Load() {
				return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("network is unreachable")}
			}
			return dialer.DialContext(ctx, network, addr)
		}}}
		c := e.newClient(t, idem.WithHTTPClient(hc))
		in, err := c.NewIntent(ctx, "checkout:cart-8", payment1500(t, srv))
		require.NoError(t, err)
		offline.Store(true)
		_, err = c.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
		require.ErrorIs(t, err, idem.ErrNotSent)
		offline.Store(false)

		clk.Advance(25 * time.Hour)
		held, err := c.HTTPRequest(ctx, in)
		require.NoError(t, err, "never sent, it may be sent now")
		clk.Advance(5 * time.Minute)
		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "its request is in the app's hands")
		assert.Equal(t, persist.StatePending, in.State())

		// A later Client (the next start) protects it too.
		next := e.newClient(t, idem.WithHTTPClient(hc))
		clk.Advance(5 * time.Minute)
		stored, err := next.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = next.Reconcile(ctx, stored)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "its request is in the app's hands")

		resp, err := hc.Do(held)
		require.NoError(t, err)
		resp.Body.Close()
		require.NoError(t, next.SendEnded(ctx, stored))
		_, err = next.Settle(ctx, stored)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, stored.State())
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})
	// Path: HTTPRequest arms the intent (durable), then its hand-out
	// write fails: it returns no request. An error that matched neither
	// ErrNotSent nor ErrOutcomeUnknown would let the app, which never got
	// a request to send, tell the user the payment did not go out; but
	// the intent stays armed in the store, and the next start's SettleAll
	// sends and charges it.
	t.Run("a hand-out whose write fails says the outcome is unknown", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		c := e.newClient(t, idem.WithStore(failHandOut{e.store}))
		in, err := c.NewIntent(ctx, "checkout:cart-15", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)
		req, err := c.HTTPRequest(ctx, in)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the armed intent may be sent later")
		assert.NotErrorIs(t, err, idem.ErrNotSent)

		next := e.newClient(t, idem.WithStore(failHandOut{e.store}))
		next.SettleAll(ctx)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "a later SettleAll sends it, as the error said")
	})
	t.Run("a hand-out whose read after the arming fails says the outcome is unknown", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		store := &failGet{Store: e.store}
		c := e.newClient(t, idem.WithStore(store))
		in, err := c.NewIntent(ctx, "checkout", e.paymentRequest(t, 1500, "cus_1"))
		require.NoError(t, err)
		store.failing.Store(true)
		req, err := c.HTTPRequest(ctx, in)
		require.Error(t, err)
		assert.Nil(t, req)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the armed intent may be sent later")
		assert.NotErrorIs(t, err, idem.ErrNotSent)
	})
	t.Run("a lookup miss is trusted once the app's send ended and the reconcile delay passed", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		in, _ := handOut(t, e)
		require.NoError(t, e.client.SendEnded(ctx, in)) // the app never sent it after all
		e.clock.Advance(3 * time.Minute)
		_, err := e.client.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateVoid, in.State())
	})

	// Path (the simulation's seed 7805563): a proxy's 407 left an intent
	// unknown; its request, handed out moments before it grew too old to
	// send, waited in the app's outbox. The intent then expired, and the
	// lookup's miss was trusted, since the intent was older than the
	// server's retention: the app's request then charged an intent that
	// read void.
	t.Run("a request handed out just before the intent grew too old is waited for from the hand-out", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		var refused atomic.Bool
		proxy := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPost && refused.CompareAndSwap(false, true) {
				// The proxy's own answer: the server never sees the request.
				return &http.Response{StatusCode: http.StatusProxyAuthRequired, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			}
			return e.srv.Client().Transport.RoundTrip(r)
		})
		c := e.newClient(t, idem.WithHTTPClient(&http.Client{Transport: proxy}), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		e.clock.Advance(sendWindow - 30*time.Second)
		req, err := c.HTTPRequest(ctx, in) // the app keeps it in its outbox
		require.NoError(t, err)
		e.clock.Advance(2 * time.Hour) // the intent is too old to send, and older than the retention
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		_, err = c.Reconcile(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the app's request may still be sent")
		assert.NotEqual(t, persist.StateVoid, in.State())

		resp, err := e.srv.Client().Do(req) // the app sends it
		require.NoError(t, err)
		resp.Body.Close()
		_, err = c.Reconcile(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, in.State())
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// Path (found by a red-team pass): the app sends a handed-out request
	// an hour later, its client gives up while a proxy holds the request,
	// and the app calls SendEnded. Only the Client it called knew when the
	// send ended: another Client on the store counted the reconcile delay
	// from the arming, an hour past, and voided the intent before the
	// held request charged it.
	t.Run("its end, reported with SendEnded, covers another Client's lookup", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		b := e.newClient(t)
		in, req := handOut(t, e)
		e.clock.Advance(time.Hour) // the app sends it an hour later
		held := &heldNetwork{base: e.srv.Client().Transport}
		held.holdNext(1) // a proxy holds it, and the app's client gives up
		_, err := (&http.Client{Transport: held}).Do(req)
		require.Error(t, err)
		require.NoError(t, e.client.SendEnded(ctx, in))

		e.clock.Advance(time.Minute)
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the app's request, sent a minute ago, may still be on its way")
		held.deliver(t)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
		assert.NotEqual(t, persist.StateVoid, loaded.State())
	})

	t.Run("its end, reported with SendEnded, never ends the claim of a Client that took the intent over", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		d := newSharedDevice(t)
		truth, srv := d.truth, d.srv
		a := d.client(t, d.fs, srv.Client(), truth, idem.RetryPolicy{})
		b, bClock := d.patient(t)
		c := d.client(t, d.fs, srv.Client(), truth, idem.RetryPolicy{})

		in, err := a.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		_, err = a.HTTPRequest(ctx, in) // the app holds the request, and never sends it
		require.NoError(t, err)
		// b takes the intent over and sends it; a gateway asks it to wait.
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Key: in.Key(), Status: 503, RetryAfter: "150", Count: 1}))
		twin, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		bDone := make(chan error, 1)
		go func() {
			_, err := b.Do(ctx, twin)
			bDone <- err
		}()
		wait := <-bClock.sleeping
		require.NoError(t, a.SendEnded(ctx, in)) // the app's own send ended: it never sent it

		truth.Advance(wait + time.Second)
		seen, err := c.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = c.Reconcile(ctx, seen)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "b's call may still send under its claim")
		bClock.release <- struct{}{} // b retries: the server charges
		require.NoError(t, <-bDone)
		assert.Equal(t, 1, srv.Stats().Payments)
		assert.NotEqual(t, persist.StateVoid, seen.State(), "the intent reads void while its payment was made")
	})

	t.Run("its end, reported with SendEnded, lets another Client trust a miss once the reconcile delay passed", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		b := e.newClient(t)
		in, _ := handOut(t, e)
		e.clock.Advance(time.Hour)
		require.NoError(t, e.client.SendEnded(ctx, in)) // the app never sent it after all
		e.clock.Advance(reconcileDelay + time.Second)
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.NoError(t, err, "not a wait for the server's retention")
		assert.Equal(t, persist.StateVoid, loaded.State())
	})

	t.Run("it is the intent's request", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		for _, quoted := range []bool{false, true} {
			var opts []idem.Option
			wantKey := func(k string) string { return k }
			if quoted {
				opts = append(opts, idem.WithQuotedKey())
				wantKey = func(k string) string { return `"` + k + `"` }
			}
			c := e.newClient(t, opts...)
			in, err := c.NewIntent(ctx, "", e.paymentRequest(t, 100, "cus_1"))
			require.NoError(t, err)
			want := in.Request()

			req, err := c.HTTPRequest(ctx, in)
			require.NoError(t, err)
			assert.Equal(t, want.Method, req.Method)
			assert.Equal(t, want.URL, req.URL.String())
			assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
			assert.Equal(t, wantKey(in.Key()), req.Header.Get("Idempotency-Key"))
			assert.Equal(t, int64(len(want.Body)), req.ContentLength)
			for range 2 { // GetBody gives the same bytes every time
				body, err := req.GetBody()
				require.NoError(t, err)
				var b [4096]byte
				n, _ := body.Read(b[:])
				assert.Equal(t, want.Body, b[:n])
			}
			resp, err := e.srv.Client().Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			// The answer went past the Client: the intent, handed out, may
			// have been sent, and a Do is answered from the server's record
			// of the key.
			assert.Equal(t, persist.StatePending, in.State())
			got, err := c.Do(ctx, in)
			require.NoError(t, err)
			assert.True(t, got.Replayed)
		}
		assert.Equal(t, 2, e.srv.Stats().ProviderCharges)
	})

	// The settings' one home: a Client's retention, clock, store and logger are
	// seen by a hand-out as by Do.
	t.Run("a hand-out sees the Client's retention", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		server := echoLookupServer
		server.Retention, server.RetentionMargin = 2*time.Hour, time.Hour
		store := dirStore(t, filepath.Join(t.TempDir(), "s"))
		t.Cleanup(func() { store.Close() })
		c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", payment1500(t, srv))
		require.NoError(t, err)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		truth.Advance(time.Hour + time.Minute)

		// A hand-out (HTTPRequest, for the app's own http.Client and the
		// RoundTripper) reads the same retention.
		requests := srv.Stats().Requests
		_, err = c.HTTPRequest(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "an intent past Retention-RetentionMargin is not handed out")
		assert.Equal(t, requests, srv.Stats().Requests, "nothing is sent")
	})
}

// failHandOut is a real store that cannot write the hand-out (the disk
// filled up between the arming write and the next).
type failHandOut struct{ persist.Store }

func (s failHandOut) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec.HandedOut {
		return errors.New("write: no space left on device")
	}
	return s.Store.Write(ctx, rec, old)
}

// failGet is a real store whose reads fail once failing is set.
type failGet struct {
	persist.Store
	failing atomic.Bool
}

func (s *failGet) Get(ctx context.Context, key string) (*persist.Record, error) {
	if s.failing.Load() {
		return nil, errors.New("read: input/output error")
	}
	return s.Store.Get(ctx, key)
}
