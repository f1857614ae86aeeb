package idem

import (
	"context"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

var retryAfterNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var retryAfterCases = []struct {
	name  string
	value string
	want  time.Duration
	ok    bool
}{
	{"delta seconds", "120", 120 * time.Second, true},
	{"zero", "0", 0, true},
	{"spaces", "  7 ", 7 * time.Second, true},
	{"IMF-fixdate", "Mon, 30 Nov 2026 12:00:30 GMT", 30 * time.Second, true},
	{"RFC 850", "Monday, 30-Nov-26 12:01:00 GMT", time.Minute, true},
	{"asctime", "Mon Nov 30 12:00:05 2026", 5 * time.Second, true},
	{"date in the past", "Mon, 30 Nov 2026 11:00:00 GMT", 0, true},
	{"ten years", "315360000", 315360000 * time.Second, true},
	{"beyond int64 seconds", "99999999999999999999999", time.Duration(math.MaxInt64), true},
	{"just past the duration range", "9223372037", time.Duration(math.MaxInt64), true},
	{"empty", "", 0, false},
	{"negative", "-5", 0, false},
	{"fraction", "1.5", 0, false},
	{"garbage", "soon", 0, false},
	{"digits then text", "12abc", 0, false},
}

// TestRetryAfter keeps what the server's Retry-After does to a wait: never
// sooner than it asks, spread a little later, refused above the cap.
func TestRetryAfter(t *testing.T) {
	t.Parallel()

	t.Run("it is read in each form HTTP gives it", func(t *testing.T) {
		t.Parallel()
		for _, tc := range retryAfterCases {
			t.Run(tc.name, func(t *testing.T) {
				got, ok := parseRetryAfter(tc.value, retryAfterNow)
				assert.Equal(t, tc.ok, ok)
				assert.Equal(t, tc.want, got)
			})
		}
	})

	t.Run("a wait is never sooner than it asks", func(t *testing.T) {
		t.Parallel()
		p := RetryPolicy{InitialInterval: 100 * time.Millisecond, Jitter: -1}
		b, _ := newTestBudget(t, p, 0, time.Time{})
		b.attempts = 1
		w, st := b.next(respWithRetryAfter("3"))
		require.Nil(t, st)
		assert.Equal(t, 3*time.Second, w, "never sooner than the server asked")

		w, st = b.next(respWithRetryAfter("Mon, 30 Nov 2026 12:00:10 GMT"))
		require.Nil(t, st)
		assert.Equal(t, 10*time.Second, w)
	})

	t.Run("clients told the same value come back at different times", func(t *testing.T) {
		t.Parallel()
		distinct := map[time.Duration]bool{}
		for range 100 {
			b, _ := newTestBudget(t, RetryPolicy{InitialInterval: 100 * time.Millisecond}, 0, time.Time{})
			b.attempts = 1
			w, st := b.next(respWithRetryAfter("10"))
			require.Nil(t, st)
			assert.GreaterOrEqual(t, w, 10*time.Second, "never sooner than asked")
			assert.LessOrEqual(t, w, 11*time.Second, "at most 10% later with the default jitter")
			distinct[w] = true
		}
		assert.Greater(t, len(distinct), 50, "clients told the same Retry-After come back at different times")
	})

	t.Run("at the deadline the spread is dropped rather than the retry", func(t *testing.T) {
		t.Parallel()
		// The deadline leaves room for the Retry-After itself and no more.
		for range 50 {
			b, _ := newTestBudget(t, RetryPolicy{InitialInterval: 100 * time.Millisecond}, 10*time.Second, time.Time{})
			b.attempts = 1
			w, st := b.next(respWithRetryAfter("10"))
			require.Nil(t, st)
			assert.Equal(t, 10*time.Second, w)
		}
	})
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, tc := range retryAfterCases {
		f.Add(tc.value)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := parseRetryAfter(v, retryAfterNow)
		if d < 0 {
			t.Fatalf("negative wait %s for %q", d, v)
		}
		if !ok && d != 0 {
			t.Fatalf("wait %s reported for unparseable %q", d, v)
		}
	})
}

// statusAfterWork lets the server do the work and then replaces its answer
// with status, times times, as a proxy in front of the server does.
type statusAfterWork struct {
	base   http.RoundTripper
	status int
	mu     sync.Mutex
	times  int
}

func (p *statusAfterWork) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.base.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost {
		return resp, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.times == 0 {
		return resp, nil
	}
	p.times--
	resp.Body.Close()
	return &http.Response{
		StatusCode: p.status, Status: strconv.Itoa(p.status) + " proxy", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"text/html"}}, Body: io.NopCloser(strings.NewReader("<html>origin error</html>")), Request: req,
	}, nil
}

// newPayment is a new one-off payment intent for the server at base.
func newPayment(t *testing.T, c *Client, base string) *Intent {
	t.Helper()
	req, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	in, err := c.NewIntent(context.Background(), "", req)
	require.NoError(t, err)
	return in
}

// newTestBudget is a budget on a manual clock at retryAfterNow whose
// context leaves deadlineIn (none when zero).
func newTestBudget(t *testing.T, p RetryPolicy, deadlineIn time.Duration, expiry time.Time) (*budget, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(retryAfterNow)
	var left lefter
	if !expiry.IsZero() {
		left = leftFunc(func() time.Duration { return expiry.Sub(clk.Now()) })
	}
	b := newBudget(context.Background(), p.withDefaults(), clk, left)
	if deadlineIn > 0 {
		b.deadline = b.start.Add(deadlineIn)
	}
	return &b, clk
}

func respWithRetryAfter(v string) *http.Response {
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {v}}}
}

// TestBudget keeps the waits of one call between its attempts and where
// they stop.
func TestBudget(t *testing.T) {
	t.Parallel()

	t.Run("the backoff grows and is capped", func(t *testing.T) {
		t.Parallel()
		p := RetryPolicy{InitialInterval: time.Second, MaxInterval: 8 * time.Second, Multiplier: 2, Jitter: -1, MaxAttempts: 100, MaxElapsed: time.Hour}
		b, _ := newTestBudget(t, p, 0, time.Time{})
		var waits []time.Duration
		for i := 0; i < 6; i++ {
			b.attempts++
			w, st := b.next(nil)
			require.Nil(t, st)
			waits = append(waits, w)
		}
		assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}, waits)
	})

	t.Run("the jitter stays within its bounds", func(t *testing.T) {
		t.Parallel()
		p := RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Second, Jitter: 0.5, MaxAttempts: 1000, MaxElapsed: 1000 * time.Hour}
		b, _ := newTestBudget(t, p, 0, time.Time{})
		distinct := map[time.Duration]bool{}
		for i := 0; i < 200; i++ {
			b.attempts = 1
			w, st := b.next(nil)
			require.Nil(t, st)
			assert.GreaterOrEqual(t, w, 500*time.Millisecond)
			assert.LessOrEqual(t, w, time.Second, "capped at MaxInterval")
			distinct[w] = true
		}
		assert.Greater(t, len(distinct), 10, "jitter spreads the waits")
	})

	// Clients that failed together and reached the cap do not retry
	// together: the waits at MaxInterval are jittered below it, not clamped
	// onto it.
	t.Run("waits at the cap are jittered", func(t *testing.T) {
		t.Parallel()
		p := RetryPolicy{InitialInterval: time.Second, MaxInterval: 4 * time.Second, Multiplier: 2, Jitter: 0.5, MaxAttempts: 1000, MaxElapsed: 1000 * time.Hour}
		b, _ := newTestBudget(t, p, 0, time.Time{})
		onCap := 0
		const n = 400
		for range n {
			b.attempts = 1
			w, st := b.next(nil)
			require.Nil(t, st)
			assert.LessOrEqual(t, w, 4*time.Second)
			if w == 4*time.Second {
				onCap++
			}
		}
		assert.Less(t, onCap, n/20, "waits that land exactly on the cap")
	})

	t.Run("the context's deadline is put on the clock's timeline", func(t *testing.T) {
		t.Parallel()
		for _, start := range []time.Time{time.Now().AddDate(-20, 0, 0), time.Now().AddDate(30, 0, 0)} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			b := newBudget(ctx, RetryPolicy{}.withDefaults(), clock.NewManual(start), nil)
			cancel()
			left := b.deadline.Sub(b.start)
			assert.LessOrEqual(t, left, time.Hour, "clock at %v", start)
			assert.Greater(t, left, 59*time.Minute, "clock at %v: the hour the context leaves, from the clock's now", start)
		}
	})

	t.Run("it stops at each bound with its reason and wait", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name     string
			policy   RetryPolicy
			deadline time.Duration
			expiry   time.Time
			attempts int
			resp     *http.Response
			reason   string
			wait     time.Duration
		}{
			{"attempts", RetryPolicy{MaxAttempts: 3}, 0, time.Time{}, 3, nil, stopAttempts, 0},
			{"retry-after above cap", RetryPolicy{MaxRetryAfter: time.Minute}, 0, time.Time{}, 1, respWithRetryAfter("315360000"), stopRetryAfterCap, 315360000 * time.Second},
			{"retry-after past the deadline", RetryPolicy{}, 5 * time.Second, time.Time{}, 1, respWithRetryAfter("10"), stopDeadline, 10 * time.Second},
			{"retry-after past max elapsed", RetryPolicy{MaxElapsed: 20 * time.Second}, 0, time.Time{}, 1, respWithRetryAfter("30"), stopElapsed, 30 * time.Second},
			{"wait reaches expiry", RetryPolicy{}, 0, retryAfterNow.Add(2 * time.Second), 1, respWithRetryAfter("2"), stopExpired, 2 * time.Second},
			// A client that honours any Retry-After: the wait and its spread
			// must not add up past math.MaxInt64 to a negative wait.
			{"retry-after past every bound", RetryPolicy{MaxRetryAfter: math.MaxInt64}, 0, time.Time{}, 1, respWithRetryAfter("99999999999999999999"), stopElapsed, math.MaxInt64},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				b, _ := newTestBudget(t, tc.policy, tc.deadline, tc.expiry)
				b.attempts = tc.attempts
				_, st := b.next(tc.resp)
				require.NotNil(t, st)
				assert.Equal(t, tc.reason, st.reason)
				assert.Equal(t, tc.wait, st.wait)
			})
		}
	})

	// A call begins no send after the deadline its record stores, by the clock
	// that counts sleep, though its own clock stopped while the device slept.
	// Another Client's lookup counts the reconcile delay from that deadline.
	t.Run("it stops at the stored send deadline though the call's clock slept", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		clk := &sleepClock{Manual: clock.NewManual(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC))}
		var sent atomic.Int32
		rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPost {
				sent.Add(1)
				clk.sleep(time.Hour) // the answer is lost, and the device sleeps
			}
			return nil, io.ErrUnexpectedEOF
		})
		c, err := New(Config{
			HTTPClient:  &http.Client{Transport: rt},
			Store:       persist.NewMemory(nil),
			Clock:       clk,
			RetryPolicy: RetryPolicy{MaxAttempts: 5, Jitter: -1},
			Server:      Server{Mark: MarkEcho},
		})
		require.NoError(t, err)
		in, err := c.NewIntent(ctx, "", Request{Method: http.MethodPost, URL: "https://api.example/payments", Body: []byte(`{}`)})
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, ErrOutcomeUnknown)
		assert.EqualValues(t, 1, sent.Load(), "a retry after the device slept past the send deadline is not sent")
		assert.Empty(t, clk.Sleeps(), "the call gives up before a backoff wait no retry could follow")
	})
}

// TestNotSentProof keeps when a call says its request was not sent: only
// when the transport's trace shows no byte of it left the device.
func TestNotSentProof(t *testing.T) {
	t.Parallel()

	t.Run("a request that never reached the server ends not sent and can be replaced", func(t *testing.T) {
		t.Parallel()
		quiet := func(s *httptest.Server) *httptest.Server {
			s.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
			return s
		}
		tlsServer := func(t *testing.T) *httptest.Server {
			s := quiet(httptest.NewUnstartedServer(http.NotFoundHandler()))
			s.StartTLS()
			t.Cleanup(s.Close)
			return s
		}
		cases := map[string]func(t *testing.T) (url string, hc *http.Client){
			"untrusted certificate": func(t *testing.T) (string, *http.Client) {
				s := tlsServer(t)
				return s.URL, &http.Client{Transport: &http.Transport{}}
			},
			"wrong hostname": func(t *testing.T) (string, *http.Client) {
				s := tlsServer(t)
				// The test certificate names 127.0.0.1 and example.com, not localhost.
				return strings.Replace(s.URL, "127.0.0.1", "localhost", 1), s.Client()
			},
			"HTTP response to HTTPS client": func(t *testing.T) (string, *http.Client) {
				s := quiet(httptest.NewServer(http.NotFoundHandler()))
				t.Cleanup(s.Close)
				return strings.Replace(s.URL, "http://", "https://", 1), &http.Client{}
			},
		}
		for name, setup := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				base, hc := setup(t)
				clk := clock.NewManual(retryAfterNow)
				var attempts atomic.Int32
				c, err := NewWith(WithHTTPClient(hc), WithClock(clk), WithAttemptHook(func(Attempt) { attempts.Add(1) }))
				require.NoError(t, err)
				ctx := context.Background()
				req, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 1500})
				require.NoError(t, err)
				in, err := c.Intent(ctx, "checkout", req)
				require.NoError(t, err)

				_, err = c.Do(ctx, in)
				var notSent *notSentError
				require.ErrorAs(t, err, &notSent)
				require.ErrorIs(t, err, ErrNotSent)
				assert.NotErrorIs(t, err, ErrOutcomeUnknown, "nothing was done")
				assert.EqualValues(t, 1, attempts.Load(), "retrying cannot fix it")
				assert.Empty(t, clk.Sleeps())
				assert.Equal(t, in.Key(), notSent.Key)

				// The intent does not block the changed cart.
				changed, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 2500})
				require.NoError(t, err)
				next, err := c.Intent(ctx, "checkout", changed)
				require.NoError(t, err, "an intent that never reached the server is replaced")
				assert.NotEqual(t, in.Key(), next.Key())
			})
		}
	})

	// A phone in a lift or in airplane mode: the request never left the
	// device (connection refused, no such host, network unreachable, a dial
	// timeout), as the transport's trace shows. The call ends not sent, the
	// changed cart goes through, and after a restart SettleAll does not send
	// what the app was told was not sent; Send sends it when asked.
	t.Run("a request that never left the device is not sent and the changed cart goes through", func(t *testing.T) {
		t.Parallel()
		refused := httptest.NewServer(http.NotFoundHandler())
		refusedURL := refused.URL
		refused.Close() // nothing listens there now
		dialing := func(err error) *http.Client {
			return &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
				return nil, err
			}}}
		}
		cases := map[string]func() (string, *http.Client){
			"connection refused": func() (string, *http.Client) { return refusedURL, &http.Client{Transport: &http.Transport{}} },
			"no such host": func() (string, *http.Client) {
				return "http://pay.example", dialing(&net.DNSError{Err: "no such host", Name: "pay.example", IsNotFound: true})
			},
			"network unreachable": func() (string, *http.Client) {
				return "http://pay.example", dialing(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ENETUNREACH})
			},
			"dial timeout": func() (string, *http.Client) {
				return "http://pay.example", dialing(&net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}})
			},
		}
		for name, setup := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				base, hc := setup()
				t.Cleanup(hc.CloseIdleConnections)
				clk := clock.NewManual(retryAfterNow)
				store := persist.NewMemory(nil)
				c, err := NewWith(WithHTTPClient(hc), WithClock(clk), WithStore(store), WithRetryPolicy(RetryPolicy{MaxAttempts: 3, Jitter: -1}))
				require.NoError(t, err)
				ctx := context.Background()
				req, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 1500})
				require.NoError(t, err)
				in, err := c.Intent(ctx, "checkout", req)
				require.NoError(t, err)

				_, err = c.Do(ctx, in)
				var notSent *notSentError
				require.ErrorAs(t, err, &notSent, "every attempt failed before writing the request")
				assert.NotErrorIs(t, err, ErrOutcomeUnknown)
				assert.Len(t, clk.Sleeps(), 2, "the network may come back: the call retries within its budget")
				assert.Equal(t, persist.StateNotSent, in.State())

				// The changed cart goes through.
				changed, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 2500})
				require.NoError(t, err)
				next, err := c.Intent(ctx, "checkout", changed)
				require.NoError(t, err, "an intent that never left the device does not block the user")
				assert.NotEqual(t, in.Key(), next.Key())

				// Not sent either, then the app restarts.
				_, err = c.Do(ctx, next)
				require.ErrorAs(t, err, &notSent)
				var attempts atomic.Int32
				restarted, err := NewWith(WithHTTPClient(hc), WithClock(clk), WithStore(store),
					WithRetryPolicy(RetryPolicy{MaxAttempts: 1}), WithAttemptHook(func(Attempt) { attempts.Add(1) }))
				require.NoError(t, err)
				settled, err := restarted.SettleAll(ctx)
				require.NoError(t, err)
				assert.Empty(t, settled, "a not-sent intent's outcome is known: it is not listed")
				assert.Zero(t, attempts.Load(), "SettleAll does not send what the app was told was not sent")
				stored, err := restarted.Load(ctx, next.Key())
				require.NoError(t, err)
				assert.Equal(t, persist.StateNotSent, stored.State())

				// A changed cart still replaces it after the restart.
				again, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 3500})
				require.NoError(t, err)
				_, err = restarted.Intent(ctx, "checkout", again)
				require.NoError(t, err, "the changed cart is not refused")

				// Send sends the changed cart when the user asks.
				_, err = restarted.Send(ctx, "checkout", again)
				require.ErrorAs(t, err, &notSent)
				assert.EqualValues(t, 1, attempts.Load(), "Send sends it")
				loaded, err := restarted.Load(ctx, notSent.Key)
				require.NoError(t, err)
				assert.Equal(t, persist.StateNotSent, loaded.State())
			})
		}
	})

	// Not sent is proven by the transport's trace, never guessed from an
	// error's type or text: a transport that fires no trace, or one whose
	// trace shows the request written (net/http resends a request on a new
	// connection when a reused one fails), never gets "not sent".
	t.Run("it is proven by the trace alone", func(t *testing.T) {
		t.Parallel()
		dnsErr := &net.DNSError{Err: "no such host", Name: "pay.example", IsNotFound: true}
		wroteThenFailed := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			tr := httptrace.ContextClientTrace(r.Context())
			tr.GetConn("pay.example:80")
			tr.GotConn(httptrace.GotConnInfo{Reused: true})
			tr.WroteHeaders()
			tr.GetConn("pay.example:80")
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		})}
		for name, hc := range map[string]*http.Client{
			"no trace":                         {Transport: noTrace{err: dnsErr}},
			"written, then the resend refused": wroteThenFailed,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				c, err := NewWith(WithHTTPClient(hc), WithClock(clock.NewManual(retryAfterNow)), WithRetryPolicy(RetryPolicy{MaxAttempts: 2}))
				require.NoError(t, err)
				ctx := context.Background()
				req, err := JSONRequest(http.MethodPost, "http://pay.example/payments", map[string]any{"amount": 1500})
				require.NoError(t, err)
				in, err := c.Intent(ctx, "checkout", req)
				require.NoError(t, err)
				_, err = c.Do(ctx, in)
				assert.NotErrorIs(t, err, ErrNotSent)
				assert.ErrorIs(t, err, ErrOutcomeUnknown)
				assert.Equal(t, persist.StatePending, in.State())
				changed, err := JSONRequest(http.MethodPost, "http://pay.example/payments", map[string]any{"amount": 2500})
				require.NoError(t, err)
				_, err = c.Intent(ctx, "checkout", changed)
				var unresolved *UnresolvedError
				assert.ErrorAs(t, err, &unresolved)
			})
		}
	})

	// net/http sends a request that carries an Idempotency-Key again, on a new
	// connection, when a reused connection fails before any answer, as when the
	// server dies right after reading it. The first copy may have been done: a
	// refused handshake on the new connection does not make the request unsent.
	t.Run("it is never said of a request the server may have read", func(t *testing.T) {
		t.Parallel()
		var charges atomic.Int32
		origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				io.WriteString(w, "ok")
				return
			}
			io.Copy(io.Discard, r.Body)
			charges.Add(1)
			// The server dies before it answers.
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}))
		origin.StartTLS()
		t.Cleanup(origin.Close)
		// The next connection reaches a node that answers plain HTTP.
		plain := httptest.NewUnstartedServer(http.NotFoundHandler())
		plain.Config.ErrorLog = log.New(io.Discard, "", 0)
		plain.Start()
		t.Cleanup(plain.Close)

		tr := origin.Client().Transport.(*http.Transport).Clone()
		var dials atomic.Int32
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			addr := plain.Listener.Addr().String()
			if dials.Add(1) == 1 {
				addr = origin.Listener.Addr().String()
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		t.Cleanup(tr.CloseIdleConnections)
		hc := &http.Client{Transport: tr}
		// The app's other calls share the connection pool.
		warm, err := hc.Get(origin.URL + "/status")
		require.NoError(t, err)
		io.Copy(io.Discard, warm.Body)
		warm.Body.Close()

		c, err := NewWith(WithHTTPClient(hc), WithClock(clock.NewManual(retryAfterNow)))
		require.NoError(t, err)
		ctx := context.Background()
		req, err := JSONRequest(http.MethodPost, origin.URL+"/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", req)
		require.NoError(t, err)

		_, err = c.Do(ctx, in)
		require.EqualValues(t, 1, charges.Load(), "the server read the request")
		assert.NotErrorIs(t, err, ErrNotSent)
		assert.ErrorIs(t, err, ErrOutcomeUnknown)

		changed, err := JSONRequest(http.MethodPost, origin.URL+"/payments", map[string]any{"amount": 2500})
		require.NoError(t, err)
		_, err = c.Intent(ctx, "checkout", changed)
		var unresolved *UnresolvedError
		assert.ErrorAs(t, err, &unresolved, "a changed cart must wait for the first payment's outcome")
	})

	// A redirect the call cannot follow (a loop, another scheme) ends it at
	// once, but its request was written: "not sent" is judged by the trace's
	// WroteHeaders, never by the final error, so the outcome is unknown and a
	// changed cart does not replace the intent.
	t.Run("a redirect the call cannot follow is never taken for not sent", func(t *testing.T) {
		t.Parallel()
		cases := map[string]func(t *testing.T) (url string, hc *http.Client){
			"redirect loop": func(t *testing.T) (string, *http.Client) {
				s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					http.Redirect(w, r, r.URL.Path, http.StatusTemporaryRedirect)
				}))
				t.Cleanup(s.Close)
				return s.URL, s.Client()
			},
			"redirect to another scheme": func(t *testing.T) (string, *http.Client) {
				s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					http.Redirect(w, r, "ftp://example.com/payments", http.StatusPermanentRedirect)
				}))
				t.Cleanup(s.Close)
				return s.URL, s.Client()
			},
		}
		for name, setup := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				base, hc := setup(t)
				c, err := NewWith(WithHTTPClient(hc), WithClock(clock.NewManual(retryAfterNow)))
				require.NoError(t, err)
				ctx := context.Background()
				req, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 1500})
				require.NoError(t, err)
				in, err := c.Intent(ctx, "checkout", req)
				require.NoError(t, err)

				_, err = c.Do(ctx, in)
				require.ErrorIs(t, err, ErrOutcomeUnknown)
				assert.NotErrorIs(t, err, ErrNotSent, "the request was written")

				changed, err := JSONRequest(http.MethodPost, base+"/payments", map[string]any{"amount": 2500})
				require.NoError(t, err)
				_, err = c.Intent(ctx, "checkout", changed)
				assert.ErrorAs(t, err, new(*UnresolvedError), "an intent that was written is never replaced")
			})
		}
	})

	// Not sent is kept on disk: after a restart on the file store, the intent
	// reads not sent, SettleAll leaves it, and a changed cart replaces it.
	t.Run("it survives a restart on the file store", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		dir := t.TempDir() + "/state"
		offline := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ENETUNREACH}
		}}}
		open := func() (*Client, *persist.FileStore) {
			store, err := persist.OpenDir(dir, nil)
			require.NoError(t, err)
			c, err := NewWith(WithStore(store), WithHTTPClient(offline), WithClock(clock.NewManual(retryAfterNow)), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}))
			require.NoError(t, err)
			return c, store
		}
		c, store := open()
		req, err := JSONRequest(http.MethodPost, "http://pay.example/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		var notSent *notSentError
		require.ErrorAs(t, err, &notSent)
		require.NoError(t, store.Close())

		c, store = open()
		defer store.Close()
		settled, err := c.SettleAll(ctx)
		require.NoError(t, err)
		assert.Empty(t, settled, "a not-sent intent's outcome is known: it is not listed")
		stored, err := c.Load(ctx, in.Key())
		require.NoError(t, err)
		assert.Equal(t, persist.StateNotSent, stored.State())
		changed, err := JSONRequest(http.MethodPost, "http://pay.example/payments", map[string]any{"amount": 2500})
		require.NoError(t, err)
		next, err := c.Intent(ctx, "checkout", changed)
		require.NoError(t, err)
		assert.NotEqual(t, in.Key(), next.Key())
	})

	// A not-sent intent sent again is stored as new before its first byte
	// leaves: if the process dies while the request is on its way, the store
	// does not say "not sent", and after the restart the changed cart waits.
	t.Run("a not-sent intent sent again is stored new before it leaves", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		mem := persist.NewMemory(nil)
		store := &diesOnWrite{Store: mem}
		var online atomic.Bool
		hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			tr := httptrace.ContextClientTrace(r.Context())
			tr.GetConn("pay.example:80")
			if !online.Load() {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			}
			tr.GotConn(httptrace.GotConnInfo{})
			tr.WroteHeaders()
			store.dead.Store(true) // the process dies with the request on its way
			return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
		})}
		c, err := NewWith(WithStore(store), WithHTTPClient(hc), WithClock(clock.NewManual(retryAfterNow)), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}))
		require.NoError(t, err)
		req, err := JSONRequest(http.MethodPost, "http://pay.example/payments", map[string]any{"amount": 1500})
		require.NoError(t, err)
		_, err = c.Send(ctx, "checkout", req)
		var notSent *notSentError
		require.ErrorAs(t, err, &notSent)

		online.Store(true)
		_, err = c.Send(ctx, "checkout", req)
		require.ErrorIs(t, err, ErrOutcomeUnknown)

		restarted, err := NewWith(WithStore(mem), WithHTTPClient(hc), WithClock(clock.NewManual(retryAfterNow)))
		require.NoError(t, err)
		changed, err := JSONRequest(http.MethodPost, "http://pay.example/payments", map[string]any{"amount": 2500})
		require.NoError(t, err)
		var unresolved *UnresolvedError
		_, err = restarted.Intent(ctx, "checkout", changed)
		require.ErrorAs(t, err, &unresolved, "the first request may have been charged")
	})
}

// timeoutError is a dial timeout as net reports one.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// noTrace is a transport that fires no httptrace event: it proves nothing
// about what it sent.
type noTrace struct{ err error }

func (t noTrace) RoundTrip(*http.Request) (*http.Response, error) { return nil, t.err }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// diesOnWrite is a store whose process dies once dead is set: no write
// reaches it after that.
type diesOnWrite struct {
	persist.Store
	dead atomic.Bool
}

func (s *diesOnWrite) Write(ctx context.Context, r, old *persist.Record) error {
	if s.dead.Load() {
		return syscall.EIO
	}
	return s.Store.Write(ctx, r, old)
}

// sleepClock is a device whose budget clock (Now, Monotonic) stops while
// it sleeps, as Go's monotonic reading does, and whose clock that counts
// sleep (SinceBoot) does not.
type sleepClock struct {
	*clock.Manual
	mu    sync.Mutex
	slept time.Duration
}

func (c *sleepClock) SinceBoot() (time.Duration, string, bool) {
	d, id, ok := c.Manual.SinceBoot()
	c.mu.Lock()
	defer c.mu.Unlock()
	return d + c.slept, id, ok
}

func (c *sleepClock) sleep(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept += d
}
