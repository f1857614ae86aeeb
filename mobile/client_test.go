package mobile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
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

func TestPayLostResponseIsReplayed(t *testing.T) {
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
}

func TestPayDeclineIsAResultAndPayAnewMakesANewIntent(t *testing.T) {
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
}

func TestPayChangedCartIsBlockedWhileUnresolved(t *testing.T) {
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
}

func TestCancelFromAnotherGoroutineStopsTheCall(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body, so the server watches the connection and ends
		// the request's context when the client goes away.
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	c, err := Open(echoConfig(stateDir(t), hang.URL))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	cancel := &Cancel{}
	go func() {
		<-arrived
		cancel.Cancel()
	}()
	res, err := c.Pay("checkout:cart-4", "/payments", []byte(cart), cancel)
	assert.Nil(t, res)
	require.Error(t, err)
	assert.Equal(t, KindCanceled, ErrorKind(err))

	unresolved, err := c.Unresolved()
	require.NoError(t, err)
	assert.Equal(t, int64(1), unresolved.Len(), "the cancelled intent stays to be settled")

	done := &Cancel{}
	done.Cancel()
	_, err = c.Settle(unresolved.Get(0).Key, done)
	assert.Equal(t, KindCanceled, ErrorKind(err), "a handle cancelled before the call stops it at once")
}

func TestOpenTwiceIsLocked(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.open(t)
	_, err := Open(echoConfig(w.dir, w.srv.URL))
	require.Error(t, err)
	assert.Equal(t, KindLocked, ErrorKind(err))
}

func TestRestartResumesWithTheSameKey(t *testing.T) {
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
}

type authorizerFunc func(key string) (string, error)

func (f authorizerFunc) Authorize(key string) (string, error) { return f(key) }

func TestAuthorizerPutsCredentialsOnEachAttempt(t *testing.T) {
	t.Parallel()
	var seen []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		n := len(seen)
		mu.Unlock()
		w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key")) // the server marks its answers
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	var calls atomic.Int64
	cfg := echoConfig(stateDir(t), srv.URL)
	cfg.Authorizer = authorizerFunc(func(key string) (string, error) {
		return "Bearer token-" + string(rune('0'+calls.Add(1))), nil
	})
	c, err := open(cfg, withClock(clock.NewManual(epoch)))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	res, err := c.Pay("checkout:cart-6", "/payments", []byte(cart), nil)
	require.NoError(t, err)
	assert.Equal(t, OutcomeSucceeded, res.Outcome)
	assert.Equal(t, []string{"Bearer token-1", "Bearer token-2"}, seen, "asked afresh for every attempt")
}

// TestAuthorizerRefreshBetweenAttemptsIsOneCharge: the Authorizer gives
// every attempt a fresh token of one account; the first answer is lost and
// the retry, under the new token, replays: one charge.
func TestAuthorizerRefreshBetweenAttemptsIsOneCharge(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var calls atomic.Int64
	c := w.open(t, func(cfg *Config) {
		cfg.Authorizer = authorizerFunc(func(string) (string, error) {
			return fmt.Sprintf("Bearer test_acme_token-%d", calls.Add(1)), nil
		})
	})
	w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})

	res, err := c.Pay("checkout:cart-refresh", "/payments", []byte(cart), nil)
	require.NoError(t, err)
	assert.Equal(t, OutcomeSucceeded, res.Outcome)
	assert.True(t, res.Replayed, "the retry under the refreshed token got the stored answer")
	assert.Equal(t, int64(2), res.Attempts)
	assert.Equal(t, int64(2), calls.Load(), "a token per attempt")
	assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
}

func TestAuthorizerFailureBeforeAnyAttemptIsNotSentOfKindAuthorizer(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.open(t, func(cfg *Config) {
		cfg.Authorizer = authorizerFunc(func(string) (string, error) { return "", errors.New("no session") })
	})

	res, err := c.Pay("checkout:cart-7", "/payments", []byte(cart), nil)
	require.NoError(t, err, "what became of the intent is a Result")
	assert.Equal(t, OutcomeNotSent, res.Outcome)
	assert.Equal(t, KindAuthorizer, res.Kind)
	assert.NotEmpty(t, res.Key)
	assert.Contains(t, res.Detail, "no session")
	assert.Equal(t, 0, w.srv.Stats().Requests, "no attempt was sent, and none was retried")
}

type blockingListener struct {
	release chan struct{}
	got     atomic.Int64
}

func (l *blockingListener) OnAttempt(*AttemptEvent) {
	l.got.Add(1)
	<-l.release
}

func TestListenerNeverBlocksTheCall(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	l := &blockingListener{release: make(chan struct{})}
	c := w.open(t, func(cfg *Config) { cfg.Listener = l })
	w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, Count: 3})

	res, err := c.Pay("checkout:cart-8", "/payments", []byte(cart), nil)
	require.NoError(t, err, "the call returns while the listener is stuck in its first event")
	assert.Equal(t, OutcomeSucceeded, res.Outcome)
	close(l.release)
	require.NoError(t, c.Close())
	assert.Equal(t, int64(4), l.got.Load(), "every attempt was delivered once the listener moved on")
}

func TestListenerEventsDescribeTheAttempts(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var (
		mu     sync.Mutex
		events []AttemptEvent
	)
	c := w.open(t, func(cfg *Config) {
		cfg.Listener = listenerFunc(func(e *AttemptEvent) {
			mu.Lock()
			events = append(events, *e)
			mu.Unlock()
		})
	})
	w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, RetryAfter: "2"})
	res, err := c.Pay("checkout:cart-9", "/payments", []byte(cart), nil)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.Len(t, events, 2)
	assert.Equal(t, AttemptEvent{Key: res.Key, Number: 1, Status: 503, Retry: true, WaitMillis: events[0].WaitMillis}, events[0])
	assert.GreaterOrEqual(t, events[0].WaitMillis, int64(2000), "never sooner than the server asked")
	assert.Equal(t, AttemptEvent{Key: res.Key, Number: 2, Status: 201}, events[1])
}

type listenerFunc func(*AttemptEvent)

func (f listenerFunc) OnAttempt(e *AttemptEvent) { f(e) }

// Open takes a copy of the Config: its Listener and Authorizer are the
// Client's for its life, and a change to the Config after Open changes no
// Client.
func TestOpenKeepsTheConfigsListenerAndAuthorizer(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var events, asked atomic.Int64
	cfg := echoConfig(w.dir, w.srv.URL)
	cfg.Listener = listenerFunc(func(*AttemptEvent) { events.Add(1) })
	cfg.Authorizer = authorizerFunc(func(string) (string, error) { asked.Add(1); return "Bearer test_acme_1", nil })
	c, err := open(cfg, withClock(w.clock))
	require.NoError(t, err)
	cfg.Listener = nil
	cfg.Authorizer = authorizerFunc(func(string) (string, error) { return "", errors.New("not this one") })

	res, err := c.Pay("checkout:cart-copy", "/payments", []byte(cart), nil)
	require.NoError(t, err)
	assert.Equal(t, OutcomeSucceeded, res.Outcome)
	require.NoError(t, c.Close())
	assert.Equal(t, int64(1), asked.Load(), "the Authorizer the Config had at Open")
	assert.Equal(t, int64(1), events.Load(), "the Listener the Config had at Open")
}

func TestClosedClientRefusesCalls(t *testing.T) {
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
}

func TestOpenRefusesABadConfig(t *testing.T) {
	t.Parallel()
	dir := stateDir(t)
	for name, cfg := range map[string]*Config{
		"nil":                    nil,
		"no state directory":     echoConfig("", "https://api.example.com"),
		"no scheme":              echoConfig(dir, "api.example.com"),
		"ftp":                    echoConfig(dir, "ftp://api.example.com"),
		"negative budget":        {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", ForegroundBudgetMillis: -1},
		"lookup without key":     {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", LookupPath: "/payments"},
		"lookup on another host": {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", LookupPath: "//lookup.example/payments?idempotency_key={key}"},
		"lookup on plain http":   {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", LookupPath: "http://api.example.com/payments?idempotency_key={key}"},
		// Long.MAX_VALUE for "no limit": in nanoseconds it wraps around.
		"foreground budget past a duration": {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", ForegroundBudgetMillis: math.MaxInt64},
		"background budget past a duration": {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", BackgroundBudgetMillis: math.MaxInt64},
		// 2^64 ns and a day: it wraps around to a retention of a day.
		"retention past a duration": {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", RetentionMillis: 18_446_744_073_709 + 24*60*60*1000},
		"attempts past an int32":    {StateDir: dir, BaseURL: "https://api.example.com", Mark: "echo", MaxAttempts: math.MaxInt32 + 1},
		"no mark":                   NewConfig(dir, "https://api.example.com"),
		"a mark that is no choice":  {StateDir: dir, BaseURL: "https://api.example.com", Mark: "Echo"},
		"an id path with a hole":    {StateDir: dir, BaseURL: "https://api.example.com", Mark: "json-id", MarkIDPath: "data..id"},
	} {
		_, err := Open(cfg)
		require.Error(t, err, name)
		assert.Equal(t, KindBadInput, ErrorKind(err), name)
	}
}

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
}

func TestPayKeepsItsOwnCopyOfTheBody(t *testing.T) {
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
}

func TestForegroundAndBackgroundBudgetsFromOneClient(t *testing.T) {
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
}

func TestAnOversizedAnswerSettlesThePaymentWithoutItsBody(t *testing.T) {
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

// The server charges and answers 201, then the outcome cannot be saved:
// Pay returns the Result, which says so, and no error, for a storage error
// means that nothing was sent.
func TestPayReturnsAnAnswerWhoseSaveFailedAndSaysSo(t *testing.T) {
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
}

// A changed cart for an action already paid is not an error of the
// device, nor a success of the changed cart: Pay says the action was paid
// earlier, with the earlier payment's key and answer, and sends nothing.
func TestPayAChangedCartOfAPaidActionSaysItIsAlreadyPaid(t *testing.T) {
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

// A Cancel pressed after the server answered does not unsay the answer:
// the payment was made, and Pay returns its Result.
func TestACancelAfterTheAnswerStillReturnsTheAnswer(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cancel := &Cancel{}
	c, err := open(echoConfig(w.dir, w.srv.URL), withClock(w.clock),
		func(c *idem.Config) { c.Store = fullAfterAnswerCancelled{persist.NewMemory(nil), cancel} })
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	res, err := c.Pay("checkout:cancelled-late", "/payments", []byte(cart), cancel)
	require.NoError(t, err, "the payment was sent and answered")
	assert.Equal(t, OutcomeSucceeded, res.Outcome)
	assert.True(t, res.NotRecorded)
	assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
}

// The first attempt reaches the server, which charges, and its answer is
// lost; the session then ends and the Authorizer fails for the retry. The
// payment may have been made: Pay says the outcome is unknown, never the
// device error whose meaning is that nothing was sent.
func TestAnAuthorizerFailureAfterAnAttemptWasSentLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var calls atomic.Int64
	c := w.open(t, func(cfg *Config) {
		cfg.Authorizer = authorizerFunc(func(string) (string, error) {
			if calls.Add(1) > 1 {
				return "", errors.New("session expired")
			}
			return "Bearer token-1", nil
		})
	})
	w.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})

	res, err := c.Pay("checkout:auth-late", "/payments", []byte(cart), nil)
	require.NoError(t, err, "an attempt was sent: the outcome is unknown, not a device error")
	assert.Equal(t, OutcomeUnknown, res.Outcome)
	assert.Equal(t, KindAuthorizer, res.Kind)
	assert.NotEmpty(t, res.Key, "the intent to Settle later")
	assert.Equal(t, 1, w.srv.Stats().ProviderCharges)
}

// The error of a refused BaseURL names it without the credentials it may
// carry: a user name and password, a query's values, a fragment; one that
// does not parse is not named at all.
func TestOpenRefusesABadBaseURLWithoutItsCredentials(t *testing.T) {
	t.Parallel()
	dir := stateDir(t)
	for _, base := range []string{
		"ftp://user:SECRET1@api.example/?access_token=SECRET2#SECRET3",
		"https://SECRET1@/payments?cart=SECRET2",
		"api.example/?access_token=SECRET1&sig=SECRET2",
		"https://user:SECRET1@api.example/%zz?access_token=SECRET2",
		"https://sk_live_SECRET1:@api.example:port/",
		"ftp://api.example/?SECRET1",
	} {
		_, err := Open(echoConfig(dir, base))
		require.Error(t, err, base)
		assert.Equal(t, KindBadInput, ErrorKind(err), base)
		assert.Contains(t, err.Error(), "BaseURL", base)
		assert.NotContains(t, err.Error(), "SECRET", base)
	}
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
