package idem_test

import (
	"context"
	"errors"
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

// TestOverrulingStore: a Client holds the server's word that an intent was
// done, while the store holds another Client's void of it, and a full disk
// refused every write over the void. The Client never reads that void: its
// view of the store writes the word over it first.
func TestOverrulingStore(t *testing.T) {
	t.Parallel()
	// A's Do ends unknown. Its Intent, and the action's intent that Intent
	// finds, tell the word A holds, never the void.
	t.Run("an Intent whose word could not be written never reads void", func(t *testing.T) {
		t.Parallel()
		w := newOverruledWorld(t)
		t.Logf("A's Do: err %v; in.State() %s", w.doErr, w.in.State())
		assert.NotEqual(t, persist.StateVoid, w.in.State(),
			"A's Do said the outcome is unknown, and A holds the server's word that it was charged; its Intent must not read void")
		// The same false read through Intent, the first half of Send, for the
		// same request: it hands out the stored void as the action's intent.
		again, err := w.a.Intent(context.Background(), "checkout", w.req)
		require.NoError(t, err)
		t.Logf("A's Intent for the same request: key %s, state %s", again.Key(), again.State())
		assert.NotEqual(t, persist.StateVoid, again.State(),
			"A's Intent for the action reads void, though A holds the server's word that it was charged")
	})

	// The user changes the cart once the disk has room. Intent lists the
	// action's latest through the view, so it finds the payment, and
	// refuses the new cart.
	t.Run("a changed cart is refused while the Client holds the word that the action was paid", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newOverruledWorld(t)
		w.roomAgain()
		changed, err := idem.JSONRequest(http.MethodPost, w.fs.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		_, err = w.a.Send(ctx, "checkout", changed)
		t.Logf("A's Send of the changed cart: err %v; charges %d", err, w.srv.Stats().ProviderCharges)
		var resolved *idem.ResolvedError
		assert.ErrorAs(t, err, &resolved, "the action is paid, as A knows: a changed request must be refused")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges, "A paid the action a second time, though it holds the server's word that the first payment was made")
	})

	// The app loaded the intent while B's void stood, and settles that
	// Intent while the disk still refuses A's word. Settle cannot read the
	// intent through the view, so it says the outcome is unknown. It never
	// tells the void its Intent still holds.
	t.Run("a stale void Intent's Settle on a full disk is unknown, never void", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var stale *idem.Intent
		w := overruledWorldWith(t, true, func(w *overruledWorld) {
			var err error
			stale, err = w.a.Load(ctx, w.in.Key())
			require.NoError(t, err)
			require.Equal(t, persist.StateVoid, stale.State(), "the setup: loaded while the void stood")
		})
		w.store.writes.Store(0)
		w.store.failAt, w.store.failAlso = 1, 2
		resp, err := w.a.Settle(ctx, stale)
		t.Logf("Settle: resp %v, err %v", resp != nil, err)
		assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "Settle told void for a payment A holds the server's word for")
	})

	// The app's pending screen lists the unresolved. The list writes A's
	// word over the void, so the app's next start reads the payment.
	t.Run("Unresolved writes the word over the void, and the next start reads it", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newOverruledWorld(t)
		w.roomAgain()
		pending, err := w.a.Unresolved(ctx)
		require.NoError(t, err)
		for _, p := range pending {
			assert.NotEqual(t, w.in.Key(), p.Key(), "the word is a payment: nothing is pending")
		}
		_, err = w.a.SettleAll(ctx)
		require.NoError(t, err)
		next, err := idem.New(idem.Config{Store: w.disk, HTTPClient: w.fs.Client(), Server: echoLookupServer, Clock: w.truth})
		require.NoError(t, err)
		later, err := next.Load(ctx, w.in.Key())
		require.NoError(t, err)
		assert.NotEqual(t, persist.StateVoid, later.State(),
			"after A's SettleAll with room on disk, the app's next start reads void for a charged payment A knew succeeded")
	})

	// Eight Loads at once of the overruled void. One writes the word; the
	// others find it stored. None fails or tells void.
	t.Run("Loads at once of an overruled void all tell the word", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newOverruledWorld(t)
		w.roomAgain()
		var wg sync.WaitGroup
		type got struct {
			in  *idem.Intent
			err error
		}
		res := make([]got, 8)
		for i := range res {
			wg.Add(1)
			go func() {
				defer wg.Done()
				in, err := w.a.Load(ctx, w.in.Key())
				res[i] = got{in, err}
			}()
		}
		wg.Wait()
		for i, r := range res {
			if r.err != nil {
				t.Logf("Load %d: err %v", i, r.err)
				assert.False(t, errors.Is(r.err, persist.ErrNotFound), "Load %d lost the intent", i)
				assert.NoError(t, r.err, "Load %d fails though the store holds the server's word", i)
				continue
			}
			assert.Equal(t, persist.StateSucceeded, r.in.State(), "Load %d", i)
		}
		stored, err := w.disk.Get(ctx, w.in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, stored.State)
	})

	// HTTPRequest reads the intent through the view. It writes the word,
	// and never advises a new intent for a paid action.
	t.Run("a hand-out of an overruled void never tells void", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newOverruledWorld(t)
		w.roomAgain()
		req, err := w.a.HTTPRequest(ctx, w.in)
		t.Logf("A's HTTPRequest: req %v, err %v; in.State() %s", req != nil, err, w.in.State())
		if err != nil {
			assert.NotContains(t, err.Error(), "is void", "HTTPRequest tells void for a payment A knows was charged")
			assert.NotContains(t, err.Error(), "NewIntent", "HTTPRequest advises a second payment for a payment A knows was charged")
		}
		assert.NotEqual(t, persist.StateVoid, w.in.State())
		stored, err := w.disk.Get(ctx, w.in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, stored.State, "A's HTTPRequest, with room on disk, leaves the void it knows is overruled")
	})

	// While the disk still refuses, A's Load, Settle and Send never tell void;
	// once it has room, each of them writes the server's word and tells it,
	// with one charge.
	t.Run("each entry point writes the word over the void once the disk has room", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			call func(t *testing.T, w *overruledWorld) (persist.State, error)
		}{
			{"Load", func(t *testing.T, w *overruledWorld) (persist.State, error) {
				in, err := w.a.Load(context.Background(), w.in.Key())
				if err != nil {
					return "", err
				}
				return in.State(), nil
			}},
			{"Settle of the Intent Do left void", func(t *testing.T, w *overruledWorld) (persist.State, error) {
				_, err := w.a.Settle(context.Background(), w.in)
				return w.in.State(), err
			}},
			{"Reconcile of the Intent Do left void", func(t *testing.T, w *overruledWorld) (persist.State, error) {
				_, err := w.a.Reconcile(context.Background(), w.in)
				return w.in.State(), err
			}},
			{"Send with the same request", func(t *testing.T, w *overruledWorld) (persist.State, error) {
				resp, err := w.a.Send(context.Background(), "checkout", w.req)
				if err != nil {
					return "", err
				}
				if resp == nil {
					return persist.StateVoid, nil
				}
				return persist.StateSucceeded, nil
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				w := newOverruledWorld(t)
				// The disk still refuses the next write.
				w.store.writes.Store(0)
				w.store.failAt, w.store.failAlso = 1, 0
				w.store.armed.Store(true)
				state, err := tc.call(t, w)
				t.Logf("full disk: state %s, err %v", state, err)
				if err == nil {
					assert.NotEqual(t, persist.StateVoid, state)
				}
				w.roomAgain()
				state, err = tc.call(t, w)
				t.Logf("room again: state %s, err %v", state, err)
				assert.NoError(t, err)
				assert.Equal(t, persist.StateSucceeded, state)
				assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
				stored, err := w.disk.Get(context.Background(), w.in.Key())
				require.NoError(t, err)
				assert.Equal(t, persist.StateSucceeded, stored.State)
			})
		}
	})

	// A's Prune, run while A still remembers the overruled void, loses neither
	// the intent nor the server's word: A's next Load and Settle tell it.
	t.Run("Prune loses neither the intent nor the word", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newOverruledWorld(t)
		w.roomAgain()
		w.truth.Advance(time.Hour)
		n, err := w.a.Prune(ctx, time.Minute)
		t.Logf("A's Prune: %d deleted, err %v", n, err)
		later, err := w.a.Load(ctx, w.in.Key())
		require.NoError(t, err)
		resp, err := w.a.Settle(ctx, later)
		require.NoError(t, err)
		assert.Equal(t, persist.StateSucceeded, later.State())
		if assert.NotNil(t, resp) {
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
		}
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})

	// A true void that A could not arbitrate. A gateway held A's POST, then
	// answered with its own 201 that copies the key: nothing was charged. B
	// voided the intent from the server's miss. A's lookup got the
	// gateway's 503, and the full disk refused the expired record over the
	// void. So A holds an expired record as its word. Once the disk has
	// room, A's Send of the same request is neither blocked for good nor
	// charged twice: the lookup finds the void true, and the action is paid
	// once.
	t.Run("an unsettled word over a true void still pays the action once", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth, srv := phoneWorld(t)
		proxy := proxyTo(t, srv)
		var (
			hold        atomic.Bool
			failLookups atomic.Int32
		)
		held, release := make(chan struct{}), make(chan struct{})
		hold.Store(true)
		fs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && hold.CompareAndSwap(true, false) {
				close(held)
				<-release
				rw.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
				rw.Header().Set("Content-Type", "application/json")
				rw.WriteHeader(http.StatusCreated)
				_, _ = rw.Write([]byte(`{"id":"pay_gateway"}`))
				return
			}
			if r.Method == http.MethodGet && r.URL.Query().Has("idempotency_key") && failLookups.Add(-1) >= 0 {
				http.Error(rw, "upstream connect error", http.StatusServiceUnavailable)
				return
			}
			proxy.ServeHTTP(rw, r)
		}))
		t.Cleanup(fs.Close)
		disk := dirStore(t, filepath.Join(t.TempDir(), "store"))
		t.Cleanup(func() { disk.Close() })
		store := &flakyWrites{Store: disk}
		b, err := idem.New(idem.Config{Store: disk, HTTPClient: fs.Client(), Server: echoLookupServer, Clock: truth})
		require.NoError(t, err)
		a, err := idem.New(idem.Config{Store: store, HTTPClient: fs.Client(), Server: echoLookupServer, Clock: truth,
			RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, fs.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := a.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := a.Do(ctx, in)
			done <- err
		}()
		<-held
		truth.Advance(time.Hour)
		loaded, err := b.Load(ctx, in.Key())
		require.NoError(t, err)
		_, err = b.Reconcile(ctx, loaded)
		require.Equal(t, persist.StateVoid, loaded.State(), "the setup: B voided (%v)", err)
		failLookups.Store(1)
		store.failAt = 2 // the first write meets the void; the second is the expired record's
		store.armed.Store(true)
		close(release)
		err = <-done
		t.Logf("A's Do: err %v, state %s", err, in.State())
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		require.Zero(t, srv.Stats().ProviderCharges, "the setup: nothing was charged")

		store.armed.Store(false)
		// The pending screen lists it: its outcome is unknown until the
		// lookup settles it.
		pending, err := a.Unresolved(ctx)
		require.NoError(t, err)
		require.Len(t, pending, 1, "the intent A told unknown is pending")
		assert.Equal(t, in.Key(), pending[0].Key())
		assert.Equal(t, persist.StateExpired, pending[0].State())

		resp, err := a.Send(ctx, "checkout", req)
		t.Logf("A's Send: err %v, resp %v, charges %d", err, resp != nil, srv.Stats().ProviderCharges)
		if err != nil {
			// Still unknown: the lookup may still wait. Once more, later.
			truth.Advance(time.Hour)
			resp, err = a.Send(ctx, "checkout", req)
			t.Logf("A's second Send: err %v, resp %v, charges %d", err, resp != nil, srv.Stats().ProviderCharges)
		}
		assert.NoError(t, err, "A is blocked from paying an action that was never charged")
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})
}

// overruledWorld is a phone world where A's first POST is held by a front
// past every bound, and B has reconciled the intent void from the server's
// miss (newHeldWorld). A's call runs on until release lets the POST go.
// A's store is flakyWrites, so a test can fill its disk. newOverruledWorld
// goes on: the POST is charged, and A's answer meets B's void. A's lookup
// confirms the answer (the server has the key), but the full disk refuses
// both of arbitrate's writes over the void (failAt 2 and failAlso 3). So A
// remembers the server's word (keys.overruled) and the store holds the
// void.
type overruledWorld struct {
	truth *clock.Manual
	srv   *fakeserver.Server
	front *holdingFront
	fs    *httptest.Server
	store *flakyWrites
	disk  *persist.FileStore
	a, b  *idem.Client
	req   idem.Request
	in    *idem.Intent
	done  chan error // A's held call's error
	doErr error
}

// newHeldWorld makes the world up to B's void. The first cart is customer's.
// A's held call is Settle if settle is set, else Do.
func newHeldWorld(t *testing.T, customer string, settle bool) *overruledWorld {
	t.Helper()
	ctx := context.Background()
	w := &overruledWorld{done: make(chan error, 1)}
	w.truth, w.srv = phoneWorld(t)
	target, err := url.Parse(w.srv.URL)
	require.NoError(t, err)
	w.front = &holdingFront{proxy: httputil.NewSingleHostReverseProxy(target), held: make(chan struct{}), release: make(chan struct{})}
	w.fs = httptest.NewServer(w.front)
	t.Cleanup(w.fs.Close)
	w.disk = dirStore(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { w.disk.Close() })
	w.store = &flakyWrites{Store: w.disk}
	w.b, err = idem.New(idem.Config{Store: w.disk, HTTPClient: w.fs.Client(), Server: echoLookupServer, Clock: w.truth})
	require.NoError(t, err)
	w.a, err = idem.New(idem.Config{Store: w.store, HTTPClient: w.fs.Client(), Server: echoLookupServer, Clock: w.truth,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
	require.NoError(t, err)
	w.req, err = idem.JSONRequest(http.MethodPost, w.fs.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": customer})
	require.NoError(t, err)
	w.in, err = w.a.Intent(ctx, "checkout", w.req)
	require.NoError(t, err)

	w.front.hold.Store(true)
	call := w.a.Do
	if settle {
		call = w.a.Settle
	}
	go func() {
		_, err := call(ctx, w.in)
		w.done <- err
	}()
	<-w.front.held
	w.truth.Advance(time.Hour) // the POST is held past every bound
	loaded, err := w.b.Load(ctx, w.in.Key())
	require.NoError(t, err)
	_, err = w.b.Reconcile(ctx, loaded)
	require.Equal(t, persist.StateVoid, loaded.State(), "the setup: B trusted the miss (%v)", err)
	return w
}

// release lets A's held POST go, and returns A's call's error.
func (w *overruledWorld) release() error {
	close(w.front.release)
	w.doErr = <-w.done
	return w.doErr
}

func newOverruledWorld(t *testing.T) *overruledWorld {
	t.Helper()
	return overruledWorldWith(t, true, nil)
}

// overruledWorldWith is newOverruledWorld with a choice. full says whether
// the disk refuses arbitrate's two writes over the void. meanwhile, if not
// nil, runs after B's void and before A's held POST is released.
func overruledWorldWith(t *testing.T, full bool, meanwhile func(w *overruledWorld)) *overruledWorld {
	t.Helper()
	w := newHeldWorld(t, "cus_1", false)
	if meanwhile != nil {
		meanwhile(w)
	}
	if !full {
		w.release()
		require.Equal(t, 1, w.srv.Stats().ProviderCharges, "the setup: the held POST was charged")
		require.NoError(t, w.doErr, "the setup: A's answer, confirmed by the lookup, is written over the void")
		return w
	}
	w.store.failAt, w.store.failAlso = 2, 3 // arbitrate's writes over the void: the answer's, then the expired record's
	w.store.armed.Store(true)
	w.release()
	require.Equal(t, 1, w.srv.Stats().ProviderCharges, "the setup: the held POST was charged")
	require.ErrorIs(t, w.doErr, idem.ErrOutcomeUnknown, "the setup: A is told unknown")
	stored, err := w.disk.Get(context.Background(), w.in.Key())
	require.NoError(t, err)
	require.Equal(t, persist.StateVoid, stored.State, "the setup: the store still holds B's void")
	return w
}

// roomAgain frees the disk: every later write lands.
func (w *overruledWorld) roomAgain() { w.store.armed.Store(false) }
