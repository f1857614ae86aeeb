package mobile

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

var epoch = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

const cart = `{"amount":1500,"currency":"AZN","customer":"cus_1"}`

// world is a fake server and a state directory shared by the Clients a
// test opens, on one manual clock.
type world struct {
	srv   *fakeserver.Server
	clock *clock.Manual
	dir   string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	clk := clock.NewManual(epoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	return &world{srv: srv, clock: clk, dir: stateDir(t)}
}

// stateDir is a state directory that does not exist yet, as on a first
// start: Open creates it, private to the app.
func stateDir(t *testing.T) string { return filepath.Join(t.TempDir(), "idem") }

// echoConfig is NewConfig for the fake server, which echoes the key.
func echoConfig(stateDir, baseURL string) *Config {
	cfg := NewConfig(stateDir, baseURL)
	cfg.Mark = "echo"
	return cfg
}

// withClock gives the facade's idem.Client the test's clock.
func withClock(clk clock.Clock) func(*idem.Config) { return func(c *idem.Config) { c.Clock = clk } }

func (w *world) open(t *testing.T, edit ...func(*Config)) *Client {
	t.Helper()
	cfg := echoConfig(w.dir, w.srv.URL)
	for _, f := range edit {
		f(cfg)
	}
	c, err := open(cfg, withClock(w.clock))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func (w *world) fault(t *testing.T, f fakeserver.Fault) {
	t.Helper()
	require.NoError(t, w.srv.InjectFault(f))
}

// TestOpen checks a Client's life from Open to Close.
func TestOpen(t *testing.T) {
	t.Run("a state directory open twice is locked", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		w.open(t)
		_, err := Open(echoConfig(w.dir, w.srv.URL))
		require.Error(t, err)
		assert.Equal(t, KindLocked, ErrorKind(err))
	})

	t.Run("a closed Client refuses calls", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t)
		require.NoError(t, c.Close())
		require.NoError(t, c.Close(), "Close twice is harmless")
		_, err := c.Pay("checkout:cart-10", "/payments", []byte(cart), nil)
		assert.Equal(t, KindClosed, ErrorKind(err))
		_, err = c.Unresolved()
		assert.Equal(t, KindClosed, ErrorKind(err))
		c2, err := Open(echoConfig(w.dir, w.srv.URL))
		require.NoError(t, err, "Close releases the directory")
		require.NoError(t, c2.Close())
	})
}

type authorizerFunc func(key string) (string, error)

func (f authorizerFunc) Authorize(key string) (string, error) { return f(key) }

type blockingListener struct {
	release chan struct{}
	got     atomic.Int64
}

func (l *blockingListener) OnAttempt(*AttemptEvent) {
	l.got.Add(1)
	<-l.release
}

type listenerFunc func(*AttemptEvent)

func (f listenerFunc) OnAttempt(e *AttemptEvent) { f(e) }

// TestPay checks a payment from the tap to its Result.
func TestPay(t *testing.T) {
	t.Parallel()
	// Path, before the check: Pay("//otherhost/payments", ...) was
	// resolved against BaseURL with ResolveReference, and the payment
	// went, with the Authorizer's token, to another host, without error.
	t.Run("a path that would leave BaseURL's origin is refused before anything is stored", func(t *testing.T) {
		t.Parallel()
		var strays atomic.Int32
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			strays.Add(1)
			w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(other.Close)
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) {
			cfg.Authorizer = authorizerFunc(func(string) (string, error) { return "Bearer test_alice_1", nil })
		})
		apiHost := strings.TrimPrefix(w.srv.URL, "http://")
		for _, path := range []string{
			"//" + strings.TrimPrefix(other.URL, "http://") + "/payments",
			other.URL + "/payments",
			"https://" + apiHost + "/payments",
			"http://alice:SECRET@" + apiHost + "/payments",
			"//" + apiHost + "@" + strings.TrimPrefix(other.URL, "http://") + "/payments",
		} {
			for what, pay := range map[string]func(string, string, []byte, *Cancel) (*Result, error){"Pay": c.Pay, "PayAnew": c.PayAnew} {
				res, err := pay("checkout:cart-4", path, []byte(cart), nil)
				require.Error(t, err, "%s %q: %+v", what, path, res)
				assert.Equal(t, KindBadInput, ErrorKind(err), "%s %q", what, path)
				assert.Contains(t, err.Error(), "leaves BaseURL's origin", "%s %q", what, path)
				assert.NotContains(t, err.Error(), "SECRET", "%s %q", what, path)
			}
		}
		assert.Zero(t, strays.Load(), "nothing went to another server")
		assert.Zero(t, w.srv.Stats().Requests, "nor to the API")
		left, err := c.Unresolved()
		require.NoError(t, err)
		assert.Zero(t, left.Len(), "nothing was stored")

		res, err := c.Pay("checkout:cart-4", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome, "the corrected path is not blocked")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})

	t.Run("a lost response is replayed", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t)
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})

		res, err := c.Pay("checkout:cart-1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.Equal(t, int64(http.StatusCreated), res.Status)
		assert.True(t, res.Replayed, "the second attempt got the first one's stored answer")
		assert.Equal(t, int64(2), res.Attempts)
		assert.NotEmpty(t, res.Key)
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)

		again, err := c.Pay("checkout:cart-1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.True(t, again.FromStore, "a second tap is answered from the device")
		assert.Equal(t, res.Key, again.Key)
		assert.Equal(t, 1, w.srv.Stats().Requests-1, "nothing more was sent")
	})

	t.Run("a decline is a Result and PayAnew makes a new intent", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t)
		declined := []byte(`{"amount":1500,"currency":"AZN","customer":"cus_declined"}`)

		res, err := c.Pay("checkout:cart-2", "/payments", declined, nil)
		require.NoError(t, err, "a decline is an outcome, not a device error")
		assert.Equal(t, OutcomeFailed, res.Outcome)
		assert.Equal(t, int64(http.StatusPaymentRequired), res.Status)
		assert.Equal(t, fakeserver.ProblemCardDeclined, res.ProblemType)

		same, err := c.Pay("checkout:cart-2", "/payments", declined, nil)
		require.NoError(t, err)
		assert.True(t, same.FromStore, "Pay with the same body returns the stored decline")
		assert.Equal(t, res.Key, same.Key)

		anew, err := c.PayAnew("checkout:cart-2", "/payments", declined, nil)
		require.NoError(t, err)
		assert.NotEqual(t, res.Key, anew.Key, "a new payment is a new intent")
		assert.False(t, anew.FromStore)
		assert.Equal(t, OutcomeFailed, anew.Outcome)
	})

	t.Run("a changed cart is blocked while the first is unresolved", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) { cfg.MaxAttempts = 2 })
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, Count: 2})

		first, err := c.Pay("checkout:cart-3", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeUnknown, first.Outcome)

		changed, err := c.Pay("checkout:cart-3", "/payments", []byte(`{"amount":2000,"currency":"AZN","customer":"cus_1"}`), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeBlocked, changed.Outcome)
		assert.Equal(t, first.Key, changed.Key, "the result names the intent that blocks")
		anew, err := c.PayAnew("checkout:cart-3", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeBlocked, anew.Outcome)
		assert.Equal(t, 0, w.srv.Stats().ProviderCharges)
	})

	// A changed cart for an action already paid is not an error of the
	// device, nor a success of the changed cart: Pay says the action was paid
	// earlier, with the earlier payment's key and answer, and sends nothing.
	t.Run("a changed cart of a paid action says it is already paid", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t)
		first, err := c.Pay("checkout:paid", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeSucceeded, first.Outcome)
		require.Equal(t, KindSucceeded, first.Kind)

		res, err := c.Pay("checkout:paid", "/payments", []byte(`{"amount":2500,"currency":"AZN","customer":"cus_1"}`), nil)
		require.NoError(t, err, "the action is paid; that is an outcome, not a device error")
		assert.Equal(t, OutcomeAlreadyPaid, res.Outcome, "the changed cart was not paid: the action was, earlier")
		assert.Equal(t, KindAlreadyPaid, res.Kind)
		assert.True(t, res.FromStore, "nothing was sent")
		assert.Equal(t, first.Key, res.Key, "the payment that paid the action")
		assert.Equal(t, first.Status, res.Status)
		assert.Equal(t, first.Body, res.Body, "the stored answer")
		assert.NotEmpty(t, res.Detail, "says the request differs from the one paid")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)

		again, err := c.PayAnew("checkout:paid", "/payments", []byte(`{"amount":2500,"currency":"AZN","customer":"cus_1"}`), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, again.Outcome, "a deliberate second payment")
		assert.NotEqual(t, first.Key, again.Key)
		assert.Equal(t, 2, w.srv.Stats().ProviderCharges)
	})

	t.Run("a restart resumes with the same key", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
		body := []byte(cart)
		first, err := c.Pay("checkout:cart-5", "/payments", body, nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeUnknown, first.Outcome)
		for i := range body {
			body[i] = 'x' // the JVM reuses the array once the call returned
		}
		require.NoError(t, c.Close())

		c2 := w.open(t)
		list, err := c2.Unresolved()
		require.NoError(t, err)
		require.Equal(t, int64(1), list.Len())
		assert.Equal(t, first.Key, list.Get(0).Key)
		assert.Equal(t, "checkout:cart-5", list.Get(0).Name)
		assert.Nil(t, list.Get(1))

		res, err := c2.Settle(first.Key, nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.True(t, res.Replayed, "the server did the work once, under the same key and bytes")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})

	t.Run("Pay keeps its own copy of the body", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
		body := []byte(cart)
		first, err := c.Pay("checkout:cart-11", "/payments", body, nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeUnknown, first.Outcome)
		for i := range body {
			body[i] = 'x' // gobind's array is the JVM's again once the call returned
		}

		res, err := c.Settle(first.Key, nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome, "the resend carried the bytes of the first attempt")
		assert.True(t, res.Replayed)
	})

	t.Run("the foreground and background budgets come from one Client", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c := w.open(t, func(cfg *Config) {
			cfg.ForegroundBudgetMillis = 5_000
			cfg.BackgroundBudgetMillis = 60_000
		})
		w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, RetryAfter: "10", Count: 2})

		tap, err := c.Pay("checkout:cart-12", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeUnknown, tap.Outcome, "a 10 s wait does not fit the tap's 5 s")
		assert.Equal(t, int64(1), tap.Attempts)

		settled, err := c.Settle(tap.Key, nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, settled.Outcome, "the background settle waits the server out")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})

	t.Run("an oversized answer settles the payment without its body", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		// The facade's own Server is replaced whole; one Pay answered at once
		// needs neither its lookup nor its retention.
		c, err := open(echoConfig(w.dir, w.srv.URL), func(c *idem.Config) { c.Server = idem.Server{Mark: idem.MarkEcho, MaxResponseBytes: 16} }, withClock(w.clock))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })

		res, err := c.Pay("checkout:cart-13", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.True(t, res.Oversized, "the payment's answer is over 16 bytes")
		assert.Empty(t, res.Body)
	})

	// The server charges and answers 201, then the outcome cannot be saved:
	// Pay returns the Result, which says so, and no error, for a storage error
	// means that nothing was sent.
	t.Run("an answer whose save failed is returned and says so", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		c, err := open(echoConfig(w.dir, w.srv.URL), withClock(w.clock), func(c *idem.Config) { c.Store = fullAfterAnswer{persist.NewMemory(nil)} })
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		res, err := c.Pay("checkout:full", "/payments", []byte(cart), nil)
		require.NoError(t, err, "the payment was sent and answered")
		assert.Equal(t, OutcomeSucceeded, res.Outcome)
		assert.Equal(t, int64(http.StatusCreated), res.Status)
		assert.True(t, res.NotRecorded)
		assert.NotEmpty(t, res.Body)
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
	})
}

// fullAfterAnswer is a store whose disk fills up as the answer arrives:
// the tap's write succeeds, the outcome's save fails.
type fullAfterAnswer struct{ persist.Store }

func (s fullAfterAnswer) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec.State.Resolved() {
		return errors.New("no space left on device")
	}
	return s.Store.Write(ctx, rec, old)
}

// fullAfterAnswerCancelled is fullAfterAnswer where the user presses
// Cancel just as the answer arrives.
type fullAfterAnswerCancelled struct {
	persist.Store
	cancel *Cancel
}

func (s fullAfterAnswerCancelled) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec.State.Resolved() {
		s.cancel.Cancel()
		return errors.New("no space left on device")
	}
	return s.Store.Write(ctx, rec, old)
}

// offlineClient is an http.Client whose connections are refused while
// down is set: nothing is written, as the trace proves.
func offlineClient(down *atomic.Bool) func(*idem.Config) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			return nil, errors.New("connect: network is unreachable")
		}
		return dial(ctx, network, addr)
	}
	return func(c *idem.Config) { c.HTTPClient = &http.Client{Transport: tr} }
}

// TestSettleAll checks the start-up loop that settles what the device
// left unresolved.
func TestSettleAll(t *testing.T) {
	t.Parallel()
	t.Run("the start-up loop never sends a not-sent intent", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		var down atomic.Bool
		first, err := open(echoConfig(w.dir, w.srv.URL), withClock(w.clock), offlineClient(&down))
		require.NoError(t, err)
		down.Store(true)
		res, err := first.Pay("checkout:cart-1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.Equal(t, OutcomeNotSent, res.Outcome, "the user is told it was not sent")
		require.NoError(t, first.Close())

		// The next start, online, runs the README's start-up loop.
		down.Store(false)
		next := w.open(t)
		left, err := next.SettleAll(nil)
		require.NoError(t, err)
		assert.Zero(t, left.Len(), "a not-sent intent's outcome is known: it is not listed")
		assert.Zero(t, w.srv.Stats().ProviderCharges, "what the user was told was not sent is never charged")
	})
}
