package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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

// Attacks that held. Each would have shown a break of a promise through the
// latest changes (record versions as a per-Client prefix and a count, one
// clock reading for the expiry check and mustHold, settings behind one
// pointer); none did.

func rtStore(t *testing.T, dir string) *persist.FileStore {
	t.Helper()
	s, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	return s
}

var rtServer = idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}

// Two Clients on one store, one after the other made, each counting its
// versions from 1: the second takes over the first's intent whose answer was
// lost, and the first then reads the second's outcome; one charge.
func TestRedTeamHeld_TwoClientsOnOneStoreNeverShareAVersion(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	store := rtStore(t, filepath.Join(t.TempDir(), "s"))
	t.Cleanup(func() { store.Close() })
	mk := func() *idem.Client {
		c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: rtServer, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		return c
	}
	a, b := mk(), mk()
	in, err := a.Intent(ctx, "checkout", rtPayment(t, srv))
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
	_, err = a.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

	loaded, err := b.Load(ctx, in.Key())
	require.NoError(t, err)
	_, err = b.Do(ctx, loaded) // takes over, resends, gets the replay
	require.NoError(t, err)
	resp, err := a.Do(ctx, in)
	require.NoError(t, err)
	assert.True(t, resp.FromStore || resp.Replayed)
	assert.Equal(t, persist.StateSucceeded, in.State())
	assert.Equal(t, 1, srv.Stats().ProviderCharges)
}

// A restart: the store is closed and opened again, and a new Client (its
// count starting again at 1 under a new prefix) resumes the intent.
func TestRedTeamHeld_AClientRemadeAfterARestartResumesOnce(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	dir := filepath.Join(t.TempDir(), "s")
	open := func(s *persist.FileStore) *idem.Client {
		c, err := idem.New(idem.Config{Store: s, HTTPClient: srv.Client(), Server: rtServer, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		return c
	}
	s1 := rtStore(t, dir)
	c := open(s1)
	in, err := c.Intent(ctx, "checkout", rtPayment(t, srv))
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()}))
	_, err = c.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.NoError(t, s1.Close())

	for range 2 {
		s := rtStore(t, dir)
		c = open(s)
		settled, err := c.SettleAll(ctx)
		require.NoError(t, err)
		t.Logf("settled %d", len(settled))
		require.NoError(t, s.Close())
	}
	s := rtStore(t, dir)
	t.Cleanup(func() { s.Close() })
	loaded, err := open(s).Load(ctx, in.Key())
	require.NoError(t, err)
	assert.Equal(t, persist.StateSucceeded, loaded.State())
	assert.Equal(t, 1, srv.Stats().ProviderCharges)
}

// A gateway copies every request header, the attempt's nonce (the record's
// version) and the key among them, into its own 200 page; a cache then
// serves that page to the next attempt, with the earlier attempt's nonce.
// Neither settles the intent.
func TestRedTeamHeld_AReflectionWithAnEarlierNonceSettlesNothing(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	var kept atomic.Pointer[http.Header]
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		if k := kept.Load(); k != nil {
			h = *k // the cached page, with the first attempt's headers
		} else {
			kept.Store(&h)
		}
		for k, v := range h {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("<html>Sign in to the Wi-Fi</html>"))
	}))
	t.Cleanup(gw.Close)
	c, err := idem.New(idem.Config{HTTPClient: gw.Client(), Server: rtServer, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second}})
	require.NoError(t, err)
	req := rtPayment(t, srv)
	req.URL = gw.URL + "/payments"
	in, err := c.Intent(ctx, "checkout", req)
	require.NoError(t, err)
	for range 2 {
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.False(t, in.State().Resolved(), "state %s", in.State())
	}
}

// A phone sleeps two hours and its wall clock is set back two hours while
// it sleeps; the intent's window is one hour. The one reading shared by the
// expiry check and mustHold still sees it expired: nothing is sent.
func TestRedTeamHeld_AClockSetBackDuringSleepDoesNotReviveAnExpiredIntent(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	server := rtServer
	server.Retention, server.RetentionMargin = 2*time.Hour, time.Hour
	c, err := idem.New(idem.Config{HTTPClient: srv.Client(), Server: server, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
	require.NoError(t, err)
	in, err := c.Intent(ctx, "checkout", rtPayment(t, srv))
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
}

// The settings' one home: a Client's retention, clock, store and logger are
// seen by a hand-out as by Do.
func TestRedTeamHeld_AHandOutSeesTheClientsRetention(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	server := rtServer
	server.Retention, server.RetentionMargin = 2*time.Hour, time.Hour
	store := rtStore(t, filepath.Join(t.TempDir(), "s"))
	t.Cleanup(func() { store.Close() })
	c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth, RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
	require.NoError(t, err)
	in, err := c.Intent(ctx, "checkout", rtPayment(t, srv))
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
}

// Two Clients on one store each make an unarmed intent for one action (two
// keys), then both tap, one after the other and at once: the store's claim
// (persist.Claim, versions from each Client's own count) lets one win, and
// the other sends the winner: one charge. (At once, the loser may see the
// winner's 409 and report the outcome unknown; a later Do settles it.)
func TestRedTeamHeld_TwoClientsArmingOneActionChargeOnce(t *testing.T) {
	for _, together := range []bool{false, true} {
		ctx := context.Background()
		truth := clock.NewManual(rtEpoch)
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth, ProcessingDelay: 20 * time.Millisecond})
		t.Cleanup(srv.Close)
		store := rtStore(t, filepath.Join(t.TempDir(), "s"))
		t.Cleanup(func() { store.Close() })
		mk := func() *idem.Client {
			c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: rtServer, Clock: truth})
			require.NoError(t, err)
			return c
		}
		a, b := mk(), mk()
		ina, err := a.Intent(ctx, "checkout", rtPayment(t, srv))
		require.NoError(t, err)
		inb, err := b.Intent(ctx, "checkout", rtPayment(t, srv))
		require.NoError(t, err)
		require.NotEqual(t, ina.Key(), inb.Key())
		if together {
			done := make(chan error, 2)
			go func() { _, err := a.Do(ctx, ina); done <- err }()
			go func() { _, err := b.Do(ctx, inb); done <- err }()
			for range 2 {
				if err := <-done; err != nil {
					require.ErrorIs(t, err, idem.ErrOutcomeUnknown) // the other's request was in progress (409)
				}
			}
			time.Sleep(50 * time.Millisecond) // the server's work ends
			_, err = a.Do(ctx, ina)
			require.NoError(t, err)
			_, err = b.Do(ctx, inb)
			require.NoError(t, err)
		} else {
			_, err = b.Do(ctx, inb)
			require.NoError(t, err)
			_, err = a.Do(ctx, ina)
			require.NoError(t, err)
		}
		assert.Equal(t, 1, srv.Stats().ProviderCharges, "together %v", together)
		assert.Equal(t, ina.Key(), inb.Key())
	}
}

// The phone sleeps two hours inside the Authorizer, between the one clock
// reading of the expiry check and the first byte; the intent's window is
// one hour. The attempt's own limit reads the clock that counts sleep, and
// nothing is sent.
func TestRedTeamHeld_ASleepBeforeTheFirstByteDoesNotSendAnExpiredIntent(t *testing.T) {
	ctx := context.Background()
	truth := clock.NewManual(rtEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth})
	t.Cleanup(srv.Close)
	server := rtServer
	server.Retention, server.RetentionMargin = 2*time.Hour, time.Hour
	phone := &rtPhone{m: truth}
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
	in, err := c.Intent(ctx, "checkout", rtPayment(t, srv))
	require.NoError(t, err)
	_, err = c.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Zero(t, srv.Stats().Requests, "nothing is sent past the window")
}
