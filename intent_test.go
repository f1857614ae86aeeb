package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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

// TestIntent keeps what Client.Intent makes of an action: one intent, one
// key, saved before anything is sent.
func TestIntent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a zero Intent is refused by every call, never a panic", func(t *testing.T) {
		t.Parallel()
		c, err := idem.NewWith(idem.WithStore(persist.NewMemory(nil)))
		require.NoError(t, err)
		for _, in := range []*idem.Intent{nil, new(idem.Intent)} {
			_, err := c.Do(ctx, in)
			assert.ErrorContains(t, err, "nil or zero intent")
			_, err = c.Settle(ctx, in)
			assert.ErrorContains(t, err, "nil or zero intent")
			_, err = c.Reconcile(ctx, in)
			assert.ErrorContains(t, err, "nil or zero intent")
			_, err = c.HTTPRequest(ctx, in)
			assert.ErrorContains(t, err, "nil or zero intent")
			assert.ErrorContains(t, c.SendEnded(ctx, in), "nil or zero intent")
			assert.ErrorContains(t, c.Forget(ctx, in), "nil or zero intent")
		}
		zero := new(idem.Intent)
		assert.Empty(t, zero.Key())
		assert.Empty(t, zero.State())
		assert.Zero(t, zero.Attempts())
	})

	// Each attempt carries the intent's own key. An app's key field, in
	// any spelling, would go beside it, and a server might read that one.
	t.Run("a request with its own Idempotency-Key field is refused at creation", func(t *testing.T) {
		t.Parallel()
		store := persist.NewMemory(nil)
		c, err := idem.NewWith(idem.WithStore(store))
		require.NoError(t, err)
		for _, field := range []string{"Idempotency-Key", "idempotency-key"} {
			req := idem.Request{Method: http.MethodPost, URL: "https://pay.example.com/payments",
				Header: http.Header{field: {"app-key-1"}}, Body: []byte(`{}`)}
			_, err := c.Intent(ctx, "checkout", req)
			assert.ErrorContains(t, err, "Idempotency-Key", field)
		}
		recs, err := store.List(ctx, persist.Filter{})
		require.NoError(t, err)
		assert.Empty(t, recs, "nothing was created")
	})

	t.Run("a request that could never be sent is refused at creation", func(t *testing.T) {
		t.Parallel()
		store := persist.NewMemory(nil)
		c, err := idem.NewWith(idem.WithStore(store))
		require.NoError(t, err)
		for _, u := range []string{
			"ftp://pay.example.com/payments",
			"file:///payments",
			"https://:443/payments",
			"https://pay.example.com:99999/payments",
			"https://pay.example.com:0/payments",
		} {
			_, err := c.Intent(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: u})
			assert.Error(t, err, "%s", u)
		}
		recs, err := store.List(context.Background(), persist.Filter{})
		require.NoError(t, err)
		assert.Empty(t, recs, "nothing was created")
	})

	// Whatever step of Client.Intent the store fails, the error is a
	// *SaveError that wraps the store's, and nothing is created.
	t.Run("a store that fails at any step makes a SaveError and no intent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		c := e.newClient(t, idem.WithStore(brokenStore{}))
		ctx := context.Background()
		req := e.paymentRequest(t, 100, "cus_1")
		for _, create := range []func() (*idem.Intent, error){
			func() (*idem.Intent, error) { return c.Intent(ctx, "checkout:broken", req) }, // reads the action's intents first
			func() (*idem.Intent, error) { // only arms
				in, err := c.NewIntent(ctx, "", req)
				require.NoError(t, err)
				_, err = c.Do(ctx, in)
				return nil, err
			},
		} {
			in, err := create()
			assert.Nil(t, in)
			var saveErr *idem.SaveError
			require.ErrorAs(t, err, &saveErr)
			assert.ErrorIs(t, err, errStoreDown)
		}
		assert.Equal(t, 0, e.srv.Stats().Requests)
	})

	t.Run("nothing is sent when the intent cannot be saved", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		c := e.newClient(t, idem.WithStore(failingStore{persist.NewMemory(nil)}))
		in, err := c.Intent(context.Background(), "checkout:full", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err, "made in memory: nothing is written before the tap")
		_, err = c.Do(context.Background(), in)
		var saveErr *idem.SaveError
		require.ErrorAs(t, err, &saveErr)
		assert.ErrorIs(t, err, errDiskFull)
		assert.Equal(t, 0, e.srv.Stats().Requests)
	})

	t.Run("a tap on a store whose claim names no latest record fails with a SaveError", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		e.store = claimWithoutCurrent{persist.NewMemory(nil)}
		c := e.newClient(t)
		in, err := c.Intent(ctx, "checkout:faulty-claim", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		var se *idem.SaveError
		require.ErrorAs(t, err, &se, "a conflict without the latest record is the store's error, not a panic")
		assert.Equal(t, "arm", se.Op)
		assert.Zero(t, e.srv.Stats().ProviderCharges)
	})

	t.Run("the latest intent is the last created whatever the clock", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewServer(&fakeserver.Options{Clock: clock.NewManual(epoch)})
		t.Cleanup(srv.Close)
		device := clock.NewManual(epoch)
		hc := &http.Client{Transport: &dropFirstAnswer{base: srv.Client().Transport}}
		hc.Transport.(*dropFirstAnswer).dropped.Store(true) // A's answer arrives
		c, err := idem.NewWith(idem.WithHTTPClient(hc), idem.WithClock(device), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		ctx := context.Background()
		cart := func(amount int) idem.Request {
			req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": amount, "currency": "AZN", "customer": "cus_1"})
			require.NoError(t, err)
			return req
		}

		a, err := c.Intent(ctx, "checkout", cart(1000))
		require.NoError(t, err)
		_, err = c.Do(ctx, a)
		require.NoError(t, err, "A is paid")

		device.Advance(-time.Hour)                         // the user sets the clock back
		b, err := c.NewIntent(ctx, "checkout", cart(2000)) // paying for it again, deliberately
		require.NoError(t, err)
		hc.Transport.(*dropFirstAnswer).dropped.Store(false) // B's answer is lost
		_, err = c.Do(ctx, b)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.Equal(t, 2, srv.Stats().Payments, "B was charged")

		_, err = c.Intent(ctx, "checkout", cart(3000))
		require.ErrorAs(t, err, new(*idem.UnresolvedError), "B, created last, is unresolved, though its clock reading is older than A's")
		assert.Equal(t, 2, srv.Stats().Payments)
	})

	// The Pay screen shows an intent for an action whose only intent was
	// declined long ago; Prune then removes that declined intent, and the
	// action is paid by another intent (the cart changed, or another part of
	// the app paid it). The tap on the screen's intent must not pay the action
	// a second time: the action's latest intent is the one that paid.
	t.Run("an intent shown before Prune never overtakes the action's later intent", func(t *testing.T) {
		t.Parallel()
		for _, clients := range []int{1, 2} {
			t.Run(fmt.Sprintf("%d clients", clients), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := newEnv(t)
				a, b := e.client, e.client
				if clients == 2 {
					b = e.newClient(t)
				}
				_, err := a.Send(ctx, "checkout:pruned", e.paymentRequest(t, 100, "cus_declined"))
				require.Error(t, err, "declined")
				e.clock.Advance(48 * time.Hour)

				shown, err := a.Intent(ctx, "checkout:pruned", e.paymentRequest(t, 100, "cus_1")) // the Pay screen
				require.NoError(t, err)
				_, err = a.Prune(ctx, 24*time.Hour)
				require.NoError(t, err)
				recs, err := e.store.List(ctx, persist.Filter{Name: "checkout:pruned"})
				require.NoError(t, err)
				require.Len(t, recs, 1)
				require.True(t, recs[0].Tombstone, "the declined intent is pruned to its tombstone")

				_, err = b.Send(ctx, "checkout:pruned", e.paymentRequest(t, 200, "cus_1"))
				require.NoError(t, err, "the action is paid")

				_, err = a.Do(ctx, shown) // the tap on the screen shown before
				assert.Error(t, err, "the action is paid by a later intent")
				assert.Equal(t, 1, e.srv.Stats().ProviderCharges, "one payment for the action")
			})
		}
	})

	t.Run("an unreadable record stops only its own action", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		dir := filepath.Join(t.TempDir(), "state")
		store, err := persist.OpenDir(dir, nil)
		require.NoError(t, err)
		t.Cleanup(func() { store.Close() })
		c := e.newClient(t, idem.WithStore(store))
		good, err := c.Intent(ctx, "checkout:good", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, good))
		bad, err := c.Intent(ctx, "checkout:bad", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, bad))

		// Damage the second intent's file on disk.
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		damaged := 0
		for _, de := range entries {
			if de.IsDir() || !strings.HasSuffix(de.Name(), ".json") {
				continue
			}
			path := filepath.Join(dir, de.Name())
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			if strings.Contains(string(data), bad.Key()) {
				require.NoError(t, os.WriteFile(path, data[:len(data)/2], 0o600))
				damaged++
			}
		}
		require.Equal(t, 1, damaged)
		require.NoError(t, store.Close())
		store, err = persist.OpenDir(dir, nil)
		require.NoError(t, err)
		t.Cleanup(func() { store.Close() })
		c = e.newClient(t, idem.WithStore(store))

		// The readable intent still resumes; a new intent for the damaged
		// record's action is refused, naming the record, because it could be
		// that action's unresolved intent; other actions go on.
		pending, err := c.Unresolved(ctx)
		var corrupt *persist.CorruptError
		require.ErrorAs(t, err, &corrupt)
		require.Len(t, pending, 1)
		assert.Equal(t, good.Key(), pending[0].Key())
		_, err = c.Do(ctx, pending[0])
		require.NoError(t, err)

		_, err = c.Intent(ctx, "checkout:bad", e.paymentRequest(t, 300, "cus_1"))
		require.ErrorAs(t, err, &corrupt)
		assert.Equal(t, bad.Key(), corrupt.Key)
		_, err = c.Intent(ctx, "checkout:other", e.paymentRequest(t, 300, "cus_1"))
		require.NoError(t, err, "a damaged file blocks only the action it may belong to")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// Changing it cannot change what the intent sends.
	t.Run("Request returns a copy", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in := e.newIntent(t, "checkout:copy", 100)
		want := e.paymentRequest(t, 100, "cus_1")

		got := in.Request()
		got.Body[0] = 'X'
		got.Header.Set("Content-Type", "text/plain")
		assert.Equal(t, want.Body, in.Request().Body)
		assert.Equal(t, "application/json", in.Request().Header.Get("Content-Type"))
		resp, err := e.client.Do(context.Background(), in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
	})

	t.Run("every attempt spells the key as when the intent was created", func(t *testing.T) {
		t.Parallel()
		for _, quotedFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("quoted first %v", quotedFirst), func(t *testing.T) {
				t.Parallel()
				clk := clock.NewManual(epoch)
				srv := newRawKeyServer(t, clk)
				store := persist.NewMemory(nil)
				client := func(quoted bool, hc *http.Client) *idem.Client {
					opts := []idem.Option{idem.WithStore(store), idem.WithClock(clk), idem.WithHTTPClient(hc), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1})}
					if quoted {
						opts = append(opts, idem.WithQuotedKey())
					}
					c, err := idem.NewWith(opts...)
					require.NoError(t, err)
					return c
				}
				ctx := context.Background()
				before := client(quotedFirst, &http.Client{Transport: &dropFirstAnswer{base: srv.Client().Transport}})
				req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
				require.NoError(t, err)
				in, err := before.Intent(ctx, "checkout", req)
				require.NoError(t, err)
				_, err = before.Do(ctx, in)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

				// The app's update turns the option the other way; the intent
				// resumes with the spelling it was created with.
				after := client(!quotedFirst, srv.Client())
				loaded, err := after.Load(ctx, in.Key())
				require.NoError(t, err)
				resp, err := after.Do(ctx, loaded)
				require.NoError(t, err)
				assert.True(t, resp.Replayed)

				want := in.Key()
				if quotedFirst {
					want = `"` + in.Key() + `"`
				}
				assert.Equal(t, []string{want, want}, srv.sent(), "every attempt sends the same bytes")
			})
		}
	})

	// After a restart, an intent stored as new reads pending: its first attempt
	// is not recorded, so it may have reached the server before the crash. Only
	// the Client that created it, and has not sent it, reports it new.
	t.Run("an intent from an earlier process never reads unsent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		req := e.paymentRequest(t, 100, "cus_1")
		in, err := e.client.Intent(ctx, "checkout:restart", req)
		require.NoError(t, err)
		require.NoError(t, idem.Arm(e.client, ctx, in))
		assert.Equal(t, persist.StateNew, in.State(), "armed here and never sent")
		// The process dies here, perhaps with the first attempt on the wire.

		next := e.newClient(t)
		loaded, err := next.Load(ctx, in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StatePending, loaded.State())
		unresolved, err := next.Unresolved(ctx)
		require.NoError(t, err)
		require.Len(t, unresolved, 1)
		assert.Equal(t, persist.StatePending, unresolved[0].State())
		again, err := next.Intent(ctx, "checkout:restart", req)
		require.NoError(t, err)
		assert.Equal(t, persist.StatePending, again.State())
		_, err = next.Intent(ctx, "checkout:restart", e.paymentRequest(t, 200, "cus_1"))
		assert.ErrorAs(t, err, new(*idem.UnresolvedError), "and it is not replaced as if unsent")
	})

	t.Run("Unresolved leaves out resolved intents", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		done := e.newIntent(t, "checkout:done", 100)
		_, err := e.client.Do(ctx, done)
		require.NoError(t, err)
		open := e.newIntent(t, "checkout:open", 200)
		pending, err := e.client.Unresolved(ctx)
		require.NoError(t, err)
		require.Len(t, pending, 1)
		assert.Equal(t, open.Key(), pending[0].Key())
	})

	// Two parts of an app hold a Client each on one store; a double tap reaches
	// both. The store decides which intent is the action's: one key, one
	// charge, the same answer for both, on either kind of store.
	t.Run("two Clients on one store make one key per action", func(t *testing.T) {
		t.Parallel()
		for _, kind := range []string{"memory", "file"} {
			t.Run(kind, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := newEnv(t)
				if kind == "file" {
					e.store, _ = storeDir(t, nil)
				}
				a, b := e.newClient(t), e.newClient(t)
				req := e.paymentRequest(t, 100, "cus_1")
				ina, err := a.Intent(ctx, "checkout:shared", req)
				require.NoError(t, err)
				inb, err := b.Intent(ctx, "checkout:shared", req)
				require.NoError(t, err)

				var wg sync.WaitGroup
				var ra, rb *idem.Response
				var erra, errb error
				wg.Go(func() { ra, erra = a.Do(ctx, ina) })
				wg.Go(func() { rb, errb = b.Do(ctx, inb) })
				wg.Wait()
				require.NoError(t, erra)
				require.NoError(t, errb)
				assert.Equal(t, ina.Key(), inb.Key(), "one key for the action")
				assert.Equal(t, decodePayment(t, ra.Body).ID, decodePayment(t, rb.Body).ID)
				assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
				recs, err := e.store.List(ctx, persist.Filter{Name: "checkout:shared"})
				require.NoError(t, err)
				assert.Len(t, recs, 1)
			})
		}
	})

	// Two Clients on an app's wrapper of a memory store, which embeds the
	// persist.Store NewMemory returns: the store's one write method claims in
	// one step, whatever the wrapper adds, and the two taps make one key and
	// one charge.
	t.Run("two Clients on an app's wrapper of a memory store make one key per action", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		e.store = &raceListStore{Store: persist.NewMemory(nil), both: make(chan struct{})}
		a, b := e.newClient(t), e.newClient(t)
		req := e.paymentRequest(t, 100, "cus_1")
		ina, err := a.Intent(ctx, "checkout:shared", req)
		require.NoError(t, err)
		inb, err := b.Intent(ctx, "checkout:shared", req)
		require.NoError(t, err)

		var wg sync.WaitGroup
		var erra, errb error
		wg.Go(func() { _, erra = a.Do(ctx, ina) })
		wg.Go(func() { _, errb = b.Do(ctx, inb) })
		wg.Wait()
		require.NoError(t, erra)
		require.NoError(t, errb)
		assert.Equal(t, ina.Key(), inb.Key(), "one key for the action")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	t.Run("same request reuses the intent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:a", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		b, err := e.client.Intent(ctx, "checkout:a", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		assert.Equal(t, a.Key(), b.Key())
	})

	t.Run("changed cart before sending replaces the unsent intent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:b", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		b, err := e.client.Intent(ctx, "checkout:b", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err)
		assert.NotEqual(t, a.Key(), b.Key())
		_, err = e.store.Get(ctx, a.Key())
		assert.ErrorIs(t, err, persist.ErrNotFound, "the unsent intent is dropped")
	})

	t.Run("changed cart after a success is refused, NewIntent pays again", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:c", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, a)
		require.NoError(t, err)
		_, err = e.client.Intent(ctx, "checkout:c", e.paymentRequest(t, 200, "cus_1"))
		var paid *idem.ResolvedError
		require.ErrorAs(t, err, &paid, "the action is paid")
		assert.Equal(t, a.Key(), paid.Previous.Key())
		require.NotNil(t, paid.Previous.Response())
		assert.Equal(t, http.StatusCreated, paid.Previous.Response().StatusCode)
		b, err := e.client.NewIntent(ctx, "checkout:c", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err, "a deliberate second payment")
		assert.NotEqual(t, a.Key(), b.Key())
	})

	t.Run("changed cart with an unknown outcome is refused", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
		a, err := e.client.Intent(ctx, "checkout:d", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: a.Key()})
		_, err = e.client.Do(ctx, a)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)

		_, err = e.client.Intent(ctx, "checkout:d", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorAs(t, err, new(*idem.UnresolvedError))
		var unresolved *idem.UnresolvedError
		require.ErrorAs(t, err, &unresolved)
		assert.Equal(t, a.Key(), unresolved.Previous.Key())
		_, err = e.client.NewIntent(ctx, "checkout:d", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorAs(t, err, new(*idem.UnresolvedError), "NewIntent refuses too")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	t.Run("after a restart a new intent may have been sent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		in, err := e.client.Intent(ctx, "checkout:e", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(e.client, ctx, in)) // tapped, then the process died
		restarted := e.newClient(t)
		_, err = restarted.Intent(ctx, "checkout:e", e.paymentRequest(t, 200, "cus_1"))
		require.ErrorAs(t, err, new(*idem.UnresolvedError))
	})

	t.Run("paying again after a decline takes NewIntent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, err := e.client.Intent(ctx, "checkout:f", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		_, err = e.client.Do(ctx, a)
		require.Error(t, err)
		same, err := e.client.Intent(ctx, "checkout:f", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		assert.Equal(t, a.Key(), same.Key(), "Intent shows the decline again")
		b, err := e.client.NewIntent(ctx, "checkout:f", e.paymentRequest(t, 100, "cus_declined"))
		require.NoError(t, err)
		assert.NotEqual(t, a.Key(), b.Key())
	})

	t.Run("intents are only for POST and PATCH", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodHead} {
			_, err := e.client.NewIntent(ctx, "", idem.Request{Method: m, URL: e.srv.URL + "/payments"})
			assert.ErrorContains(t, err, "intents are for POST and PATCH", m)
		}
	})

	// Path, before the check: Request.validate checked the method and the
	// URL but not the header fields, so a request whose header value
	// net/http refuses (a newline, as a value read from a file keeps) was
	// stored and armed. Every attempt failed in net/http before it dialled;
	// the call reported the outcome unknown after 10 attempts (nothing can
	// ever have been sent), the intent stayed pending for good, and the
	// corrected request for the same action was blocked behind it
	// (UnresolvedError) until the app Forgot it.
	t.Run("a header field net/http cannot send is refused at creation, naming the field", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		hc := &http.Client{Transport: e.client.RoundTripper(nil)}
		for _, bad := range []struct{ name, value string }{
			{"X-Client-Version", "4.2.0\n"},
			{"X-Client-Version", "4.2.0\r\nX-Evil: SECRET"},
			{"X-Client-Version", "SECRET\x00"},
			{"X-Client Version", "4.2.0"},
		} {
			req := e.paymentRequest(t, 100, "cus_1")
			req.Header[bad.name] = []string{bad.value}
			for what, create := range map[string]func() error{
				"Intent":    func() error { _, err := e.client.Intent(ctx, "checkout:h", req); return err },
				"NewIntent": func() error { _, err := e.client.NewIntent(ctx, "checkout:h", req); return err },
				"Send":      func() error { _, err := e.client.Send(ctx, "checkout:h", req); return err },
				"RoundTripper": func() error {
					r, err := http.NewRequestWithContext(idem.ContextWithAction(ctx, "checkout:h"), req.Method, req.URL, strings.NewReader(string(req.Body)))
					require.NoError(t, err)
					r.Header = req.Header.Clone()
					resp, err := hc.Do(r)
					if err == nil {
						resp.Body.Close()
					}
					return err
				},
			} {
				err := create()
				require.Error(t, err, "%s %q", what, bad)
				assert.Contains(t, err.Error(), fmt.Sprintf("%q", bad.name), "%s: the error names the field", what)
				assert.NotContains(t, err.Error(), "SECRET", "%s: the value is not shown", what)
			}
		}
		recs, err := e.store.List(ctx, persist.Filter{})
		require.NoError(t, err)
		assert.Empty(t, recs, "nothing was stored")
		assert.Zero(t, e.srv.Stats().Requests, "nothing was sent")

		fixed := e.paymentRequest(t, 100, "cus_1")
		fixed.Header.Set("X-Client-Version", "4.2.0\t(build 7)")
		_, err = e.client.Send(ctx, "checkout:h", fixed)
		require.NoError(t, err, "the corrected request goes through")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// The store keeps text as JSON, which changes bytes that are not
	// UTF-8. Such a header would be resent as other bytes after a
	// restart. Such an action name would make its paid record unreadable,
	// and the next Send would lose the answer. So both are refused at
	// creation, before anything is stored or sent.
	t.Run("a header value or action name that is not UTF-8 is refused at creation", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		header := e.paymentRequest(t, 100, "cus_1")
		header.Header["X-Note"] = []string{"caf\xe9"}
		plain := e.paymentRequest(t, 100, "cus_1")
		for _, c := range []struct {
			name, action string
			req          idem.Request
		}{
			{`"X-Note"`, "checkout:u", header},
			{"action name", "checkout:caf\xe9", plain},
		} {
			for what, create := range map[string]func() error{
				"Intent":    func() error { _, err := e.client.Intent(ctx, c.action, c.req); return err },
				"NewIntent": func() error { _, err := e.client.NewIntent(ctx, c.action, c.req); return err },
				"Send":      func() error { _, err := e.client.Send(ctx, c.action, c.req); return err },
			} {
				err := create()
				require.Error(t, err, "%s %s", what, c.name)
				assert.Contains(t, err.Error(), c.name, "%s: the error names what", what)
				assert.Contains(t, err.Error(), "not valid UTF-8", "%s: and why", what)
				assert.Contains(t, err.Error(), "give it in UTF-8", "%s: and what to give", what)
			}
		}
		recs, err := e.store.List(ctx, persist.Filter{})
		require.NoError(t, err)
		assert.Empty(t, recs, "nothing was stored")
		assert.Zero(t, e.srv.Stats().Requests, "nothing was sent")
	})

	// Two Clients on one store each make an unarmed intent for one action (two
	// keys), then both tap, one after the other and at once: the store's claim
	// (persist.Claim, versions from each Client's own count) lets one win, and
	// the other sends the winner: one charge. (At once, the loser may see the
	// winner's 409 and report the outcome unknown; a later Do settles it.)
	t.Run("two Clients arming one action charge once", func(t *testing.T) {
		t.Parallel()
		for _, together := range []bool{false, true} {
			ctx := context.Background()
			truth := clock.NewManual(phoneEpoch)
			srv := fakeserver.NewServer(&fakeserver.Options{Clock: truth, ProcessingDelay: 20 * time.Millisecond})
			t.Cleanup(srv.Close)
			store := dirStore(t, filepath.Join(t.TempDir(), "s"))
			t.Cleanup(func() { store.Close() })
			mk := func() *idem.Client {
				c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: echoLookupServer, Clock: truth})
				require.NoError(t, err)
				return c
			}
			a, b := mk(), mk()
			ina, err := a.Intent(ctx, "checkout", payment1500(t, srv))
			require.NoError(t, err)
			inb, err := b.Intent(ctx, "checkout", payment1500(t, srv))
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
	})
}

// rawKeyServer is the fake server behind a front that records the raw
// Idempotency-Key value of every POST, as servers that compare raw values
// see it.
type rawKeyServer struct {
	*httptest.Server
	mu   sync.Mutex
	keys []string
}

func newRawKeyServer(t *testing.T, clk *clock.Manual) *rawKeyServer {
	t.Helper()
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: clk})
	k := &rawKeyServer{}
	k.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			k.mu.Lock()
			k.keys = append(k.keys, r.Header.Get("Idempotency-Key"))
			k.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(k.Close)
	return k
}

func (k *rawKeyServer) sent() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

// dropFirstAnswer lets the first POST reach the server and loses its
// answer, as a network that breaks after the server committed.
type dropFirstAnswer struct {
	base    http.RoundTripper
	dropped atomic.Bool
}

func (d *dropFirstAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.base.RoundTrip(req)
	if err == nil && req.Method == http.MethodPost && d.dropped.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, errors.New("connection reset after the server answered")
	}
	return resp, err
}

var errStoreDown = errors.New("store down")

// brokenStore fails every operation, as a store whose disk is gone does.
type brokenStore struct{}

func (brokenStore) Write(context.Context, *persist.Record, *persist.Record) error {
	return errStoreDown
}
func (brokenStore) Get(context.Context, string) (*persist.Record, error) {
	return nil, errStoreDown
}
func (brokenStore) List(context.Context, persist.Filter) ([]*persist.Record, error) {
	return nil, errStoreDown
}
func (brokenStore) Delete(context.Context, *persist.Record) error { return errStoreDown }

// failingStore refuses every write, as a full disk would.
type failingStore struct{ persist.Store }

var errDiskFull = errors.New("no space left on device")

func (failingStore) Write(context.Context, *persist.Record, *persist.Record) error {
	return errDiskFull
}

// TestChangedCart keeps when a changed request replaces the action's
// intent: only when the old one can never have been sent.
func TestChangedCart(t *testing.T) {
	t.Parallel()

	// While the first attempt is on the wire the intent counts as sent: a
	// changed cart is refused, not allowed to replace it and pay twice.
	t.Run("an intent on the wire is not replaced", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		g := newGatedServer(t)
		c := g.newClient(t)
		a, err := c.Intent(ctx, "checkout:wire", g.payment(t, 100))
		require.NoError(t, err)

		done := make(chan error, 1)
		go func() {
			_, err := c.Do(ctx, a)
			done <- err
		}()
		require.Equal(t, a.Key(), <-g.arrived)

		_, err = c.Intent(ctx, "checkout:wire", g.payment(t, 200))
		require.ErrorAs(t, err, new(*idem.UnresolvedError))
		// Neither the Reconcile nor the Forget of a busy intent may run.
		_, err = c.Reconcile(ctx, a)
		require.ErrorIs(t, err, idem.ErrInFlight)
		require.ErrorIs(t, c.Forget(ctx, a), idem.ErrInFlight)

		g.open()
		require.NoError(t, <-done)
		assert.Equal(t, 1, g.h.Stats().ProviderCharges)
		assert.Equal(t, persist.StateSucceeded, a.State())
	})

	// Intent drops an unsent intent for a changed cart; a Do of the old intent
	// that starts while the drop is under way must not send it, or the old cart
	// and the new one are both paid.
	t.Run("a dropped intent is never sent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		store := deleteGate{Store: persist.NewMemory(nil), entered: make(chan struct{}, 1), release: make(chan struct{})}
		c := e.newClient(t, idem.WithStore(store))
		old, err := c.Intent(ctx, "checkout:race", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(c, ctx, old)) // tapped; its first byte not sent yet

		type result struct {
			in  *idem.Intent
			err error
		}
		replaced := make(chan result, 1)
		go func() {
			in, err := c.Intent(ctx, "checkout:race", e.paymentRequest(t, 200, "cus_1"))
			replaced <- result{in, err}
		}()
		<-store.entered // the old intent is being dropped
		// A Do meanwhile waits for the drop to be decided, and never sends it.
		did := make(chan error, 1)
		go func() {
			_, err := c.Do(ctx, old)
			did <- err
		}()
		close(store.release)
		assert.ErrorIs(t, <-did, idem.ErrIntentReplaced, "the dropped intent must not be sent")
		r := <-replaced
		require.NoError(t, r.err)
		_, err = c.Do(ctx, r.in)
		require.NoError(t, err)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
		_, err = c.Do(ctx, old)
		assert.Error(t, err, "nor later")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// One Client's changed cart never replaces an intent the other Client has
	// armed: it may be on the wire.
	t.Run("it never replaces another Client's armed intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		a, b := e.newClient(t), e.newClient(t)
		ina, err := a.Intent(ctx, "checkout:shared", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		inb, err := b.Intent(ctx, "checkout:shared", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err)
		require.NoError(t, idem.Arm(a, ctx, ina)) // a's tap; its first byte is leaving

		_, err = b.Do(ctx, inb)
		require.ErrorAs(t, err, new(*idem.UnresolvedError), "b's cart would be a second payment")
		_, err = b.Intent(ctx, "checkout:shared", e.paymentRequest(t, 300, "cus_1"))
		require.ErrorAs(t, err, new(*idem.UnresolvedError))
		_, err = e.store.Get(ctx, ina.Key())
		require.NoError(t, err, "a's intent is still stored")
		_, err = a.Do(ctx, ina)
		require.NoError(t, err)
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})

	// A Pay screen whose cart changes again and again replaces its unsent
	// intent each time: what the Client holds stays one intent's worth.
	t.Run("replaced unsent intents do not accumulate", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		var last *idem.Intent
		for i := range 2000 {
			in, err := e.client.Intent(ctx, "checkout:changing", e.paymentRequest(t, 100+i, "cus_1"))
			require.NoError(t, err)
			last = in
		}
		assert.LessOrEqual(t, idem.Tracked(e.client), 1)
		_, err := e.client.Do(ctx, last)
		require.NoError(t, err)
		assert.Zero(t, idem.Tracked(e.client), "nothing once the outcome is known")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
}

// deleteGate holds Delete until released, and says when one starts.
type deleteGate struct {
	persist.Store
	entered chan struct{}
	release chan struct{}
}

func (s deleteGate) Delete(ctx context.Context, old *persist.Record) error {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Delete(ctx, old)
}

// holdPOSTs holds every POST until release is closed, as a slow network
// holds a request that has left the device: entered hears of each one.
type holdPOSTs struct {
	base    http.RoundTripper
	entered chan struct{}
	release chan struct{}
}

func (h holdPOSTs) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost {
		h.entered <- struct{}{}
		<-h.release
	}
	return h.base.RoundTrip(req)
}

// refuseFirstPOST refuses the first POST's connection, as a network that
// is down does (nothing leaves the device), and sends the rest.
type refuseFirstPOST struct {
	refusing, base http.RoundTripper
	posts          *atomic.Int32
}

func (r refuseFirstPOST) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost && r.posts.Add(1) == 1 {
		return r.refusing.RoundTrip(req)
	}
	return r.base.RoundTrip(req)
}

// raceListStore is an app's wrapper of a memory store that embeds
// persist.Store and adds nothing but its List. Its List holds two Lists of
// one action, after the two Intents' own, until both have read, so that
// two arming claims made through List and then a write would both find no
// intent.
type raceListStore struct {
	persist.Store
	mu    sync.Mutex
	lists int
	both  chan struct{}
}

func (s *raceListStore) List(ctx context.Context, f persist.Filter) ([]*persist.Record, error) {
	recs, err := s.Store.List(ctx, f)
	if f.Name != "" {
		s.mu.Lock()
		s.lists++
		n := s.lists
		s.mu.Unlock()
		if n == 4 {
			close(s.both)
		}
		if n >= 3 {
			<-s.both
		}
	}
	return recs, err
}

// claimWithoutCurrent is a store whose write of a new intent reports a
// conflict without the action's latest record, as a faulty store might.
type claimWithoutCurrent struct{ persist.Store }

func (s claimWithoutCurrent) Write(ctx context.Context, rec, old *persist.Record) error {
	if old == nil {
		return &persist.ConflictError{Key: rec.Key}
	}
	return s.Store.Write(ctx, rec, old)
}

func TestNewIntent(t *testing.T) {
	t.Parallel()
	t.Run("an intent shown before a later payment of the action never pays after it", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		req := e.paymentRequest(t, 100, "cus_1")
		shown, err := e.client.NewIntent(ctx, "checkout", req) // shown, never tapped
		require.NoError(t, err)
		e.clock.Advance(11 * time.Hour)
		other := e.newClient(t) // another part of the app, on the same store
		paid, err := other.NewIntent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = other.Do(ctx, paid)
		require.NoError(t, err)

		_, err = e.client.Do(ctx, shown) // a stale screen's tap
		require.ErrorAs(t, err, new(*idem.ResolvedError))
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
}

// syncFailsWhen persists every write and then reports a failure for the
// writes fail picks, as a file store whose fsync failed does: the record
// is complete on disk, not known to be durable, and read back later.
type syncFailsWhen struct {
	persist.Store
	fail func(rec, old *persist.Record) bool
}

var errSyncFailed = errors.New("fsync: input/output error")

func (s *syncFailsWhen) Write(ctx context.Context, rec, old *persist.Record) error {
	if err := s.Store.Write(ctx, rec, old); err != nil {
		return err
	}
	if s.fail != nil && s.fail(rec, old) {
		return errSyncFailed
	}
	return nil
}

func TestArmingWrite(t *testing.T) {
	t.Parallel()
	t.Run("a write whose result is unknown never says nothing was sent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		var once atomic.Bool
		e.store = &syncFailsWhen{Store: persist.NewMemory(nil), fail: func(_, old *persist.Record) bool {
			return old == nil && once.CompareAndSwap(false, true) // the claim
		}}
		c := e.newClient(t)
		in, err := c.Intent(ctx, "checkout:sync", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.Error(t, err)
		var se *idem.SaveError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, "arm", se.Op)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the arming write may have landed")
		assert.NotErrorIs(t, err, idem.ErrNotSent)
		assert.Zero(t, e.srv.Stats().ProviderCharges, "this call sent nothing")
	})
}

func TestUnarmedIntent(t *testing.T) {
	t.Parallel()
	t.Run("is never handed out again once another Client's intent took its place", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		hc, down := switchable()
		a := e.newClient(t, idem.WithHTTPClient(hc))
		b := e.newClient(t)
		// The action's first payment (seq 1), then a changed cart tapped
		// offline: stored not sent (seq 2).
		first, err := a.Intent(ctx, "tips", e.paymentRequest(t, 50, "cus_1"))
		require.NoError(t, err)
		_, err = a.Do(ctx, first)
		require.NoError(t, err)
		offline, err := a.NewIntent(ctx, "tips", e.paymentRequest(t, 60, "cus_1"))
		require.NoError(t, err)
		down.Store(true)
		hc.CloseIdleConnections()
		_, err = a.Do(oneAttempt(), offline)
		require.ErrorIs(t, err, idem.ErrNotSent)
		down.Store(false)
		// Client a shows another cart: it replaces the not-sent intent
		// (deleted, freeing its seq), and the user leaves.
		shown, err := a.Intent(ctx, "tips", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		// Client b, on the same store, pays that cart: the first payment
		// is its latest, so it is a new payment, which takes the freed
		// seq. Its answer is lost.
		_, err = b.Intent(ctx, "tips", e.paymentRequest(t, 100, "cus_1"))
		require.ErrorAs(t, err, new(*idem.ResolvedError))
		paid, err := b.NewIntent(ctx, "tips", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: paid.Key()})
		_, err = b.Do(oneAttempt(), paid)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.Equal(t, 2, e.srv.Stats().ProviderCharges)
		// The user taps the cart on client a: it is b's intent, resumed.
		tap, err := a.Intent(ctx, "tips", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		assert.NotEqual(t, shown.Key(), tap.Key(), "the intent shown before b's payment is handed out again")
		assert.Equal(t, paid.Key(), tap.Key())
		_, _ = a.Do(ctx, tap)
		assert.Equal(t, 2, e.srv.Stats().ProviderCharges, "one cart, one charge")
	})

	// A's POST is held, and B voids the intent from the server's miss. The
	// user changes the cart: the action's latest is void, so A makes a new
	// intent for it, unarmed. Then the held POST is charged, and A gets the
	// server's word that it was paid. The word is written over the void,
	// or, on a full disk, A holds it. The user taps Pay on the changed
	// cart. The action is paid, so the tap sends nothing.
	for _, tc := range []struct {
		name string
		full bool
	}{
		{"made over a void is never armed once a payment is written over the void", false},
		{"made over a void is never armed while its Client holds a payment's word over the void", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var changed *idem.Intent
			w := overruledWorldWith(t, tc.full, func(w *overruledWorld) {
				req, err := idem.JSONRequest(http.MethodPost, w.fs.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_1"})
				require.NoError(t, err)
				changed, err = w.a.Intent(ctx, "checkout", req)
				require.NoError(t, err, "the setup: the action's latest is void, so a changed cart is a new intent")
			})
			w.roomAgain()
			_, err := w.a.Do(ctx, changed)
			t.Logf("A's Do of the changed cart: err %v; charges %d", err, w.srv.Stats().ProviderCharges)
			var resolved *idem.ResolvedError
			assert.ErrorAs(t, err, &resolved, "the action is paid")
			assert.Equal(t, 1, w.srv.Stats().ProviderCharges, "a changed cart was charged for an action already paid")
		})
	}
}
