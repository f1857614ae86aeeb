package idem_test

import (
	"bytes"
	"context"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"

	"errors"
	"io"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/fakeserver"
)

// answering is a test server that answers every request with h, and a
// Client that sends to it on a manual clock.
//
// The server marks its answers as the contract asks (see marking).
func answering(t *testing.T, h http.HandlerFunc, opts ...idem.Option) (*idem.Client, idem.Request) {
	t.Helper()
	srv := httptest.NewServer(marking(h))
	t.Cleanup(srv.Close)
	base := []idem.Option{idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)), idem.WithLookup(contractLookup)}
	c, err := idem.NewWith(append(base, opts...)...)
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100})
	require.NoError(t, err)
	return c, req
}

// chunked makes every answer of h chunked: it drops Content-Length and
// flushes after each write, so a cut in the body is a missing chunk rather
// than a short Content-Length.
type chunked struct{ h http.Handler }

type chunkedWriter struct{ http.ResponseWriter }

func (w chunkedWriter) WriteHeader(code int) {
	w.Header().Del("Content-Length")
	w.ResponseWriter.WriteHeader(code)
}

func (w chunkedWriter) Write(p []byte) (int, error) {
	// Two chunks, so a cut can fall between them.
	half := len(p) / 2
	n, err := w.ResponseWriter.Write(p[:half])
	if err != nil {
		return n, err
	}
	w.ResponseWriter.(http.Flusher).Flush()
	m, err := w.ResponseWriter.Write(p[half:])
	w.ResponseWriter.(http.Flusher).Flush()
	return n + m, err
}

func (c chunked) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.h.ServeHTTP(chunkedWriter{w}, r)
}

// attemptLog collects the attempts of a client.
type attemptLog struct {
	mu sync.Mutex
	a  []idem.Attempt
}

func (l *attemptLog) hook(a idem.Attempt) {
	l.mu.Lock()
	l.a = append(l.a, a)
	l.mu.Unlock()
}

func (l *attemptLog) all() []idem.Attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]idem.Attempt(nil), l.a...)
}

// TestAttemptHook keeps what the attempt hook hears of each attempt: all of
// them, with the caller's context, and no credential.
func TestAttemptHook(t *testing.T) {
	t.Parallel()

	// The attempt hook hears each attempt's action name, URL (its password
	// redacted) and duration, measured on the Client's clock: a server that
	// takes 250ms on the manual clock makes attempts of exactly 250ms, and the
	// wait after one is not part of it.
	t.Run("it hears each attempt's name, URL and duration", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewManual(epoch)
		srv := &server{answer: func(n int, req *http.Request) (*http.Response, error) {
			clk.Advance(250 * time.Millisecond)
			if n == 1 {
				return unavailable(n, req)
			}
			return created(n, req)
		}}
		var (
			mu       sync.Mutex
			attempts []idem.Attempt
		)
		c := budgetClient(t, srv, clk, persist.NewMemory(nil), idem.WithAttemptHook(func(a idem.Attempt) {
			mu.Lock()
			defer mu.Unlock()
			// TestAttemptHook/it gets the caller's context checks the context.
			a.Err, a.Context = nil, nil
			attempts = append(attempts, a)
		}))
		req := idem.Request{Method: http.MethodPost, URL: "https://shop:s3cret@api.example/payments?cart=42", Body: []byte(`{}`)}
		resp, err := c.Send(context.Background(), "checkout:cart-42", req)
		require.NoError(t, err)
		require.Equal(t, 2, resp.Attempts)
		key := attempts[0].Key
		redacted := "https://shop:xxxxx@api.example/payments?cart=42"
		assert.Equal(t, []idem.Attempt{
			{Key: key, Number: 1, StatusCode: 503, Retry: true, Wait: 500 * time.Millisecond, Name: "checkout:cart-42", URL: redacted, Duration: 250 * time.Millisecond},
			{Key: key, Number: 2, StatusCode: 201, Name: "checkout:cart-42", URL: redacted, Duration: 250 * time.Millisecond},
		}, attempts)

		// A request of the RoundTripper under its own key has no name.
		attempts = nil
		hreq, err := http.NewRequest(http.MethodPost, "https://api.example/refunds", http.NoBody)
		require.NoError(t, err)
		hreq.Header.Set("Idempotency-Key", "refund-1")
		hresp, err := (&http.Client{Transport: c.RoundTripper(srv)}).Do(hreq)
		require.NoError(t, err)
		hresp.Body.Close()
		require.Len(t, attempts, 1)
		assert.Equal(t, "", attempts[0].Name)
		assert.Equal(t, "https://api.example/refunds", attempts[0].URL)
		assert.Equal(t, 250*time.Millisecond, attempts[0].Duration)
	})

	// An attempt cut short by the caller's cancel is counted, and the attempt
	// hook hears of it like any other.
	t.Run("it hears of an attempt cut short by cancellation", func(t *testing.T) {
		t.Parallel()
		arrived := make(chan struct{}, 1)
		stop := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-stop:
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(stop) })
		var mu sync.Mutex
		var heard []idem.Attempt
		c, err := idem.NewWith(idem.WithHTTPClient(srv.Client()), idem.WithClock(clock.NewManual(epoch)),
			idem.WithAttemptHook(func(a idem.Attempt) { mu.Lock(); heard = append(heard, a); mu.Unlock() }))
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 100})
		require.NoError(t, err)
		in, err := c.NewIntent(context.Background(), "", req)
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-arrived; cancel() }()
		_, err = c.Do(ctx, in)
		var re *idem.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, 1, re.Attempts)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, heard, 1, "the counted attempt is reported")
		assert.Equal(t, 1, heard[0].Number)
		assert.Error(t, heard[0].Err)
	})

	// The attempt hook gets the context of the call each attempt belongs to, the
	// caller's values in it (a trace span, a logger's), whichever way the call was
	// made.
	t.Run("it gets the caller's context", func(t *testing.T) {
		t.Parallel()
		type callerKey struct{}
		var (
			mu    sync.Mutex
			heard []string
		)
		lost := true
		rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			mu.Lock()
			drop := lost
			mu.Unlock()
			if drop {
				return nil, io.ErrUnexpectedEOF
			}
			return answer(req, http.StatusCreated), nil
		})
		c, err := idem.New(idem.Config{
			HTTPClient:  &http.Client{Transport: rt},
			Store:       persist.NewMemory(nil),
			Clock:       clock.NewManual(time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)),
			RetryPolicy: idem.RetryPolicy{MaxAttempts: 2, Jitter: -1},
			Server:      idem.Server{Mark: idem.MarkEcho},
			OnAttempt: func(a idem.Attempt) {
				v, _ := a.Context.Value(callerKey{}).(string)
				mu.Lock()
				heard = append(heard, v)
				mu.Unlock()
			},
		})
		require.NoError(t, err)
		took := func() []string {
			mu.Lock()
			defer mu.Unlock()
			h := heard
			heard = nil
			return h
		}
		req := idem.Request{Method: http.MethodPost, URL: "https://api.example/payments", Body: []byte(`{"amount":1}`)}

		t.Run("a Send's attempts carry its context", func(t *testing.T) {
			_, err := c.Send(context.WithValue(context.Background(), callerKey{}, "tap"), "checkout:1", req)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.Equal(t, []string{"tap", "tap"}, took())
		})
		t.Run("SettleAll's attempts carry the context SettleAll got", func(t *testing.T) {
			mu.Lock()
			lost = false
			mu.Unlock()
			settled, err := c.SettleAll(context.WithValue(context.Background(), callerKey{}, "app start"))
			require.NoError(t, err)
			require.Len(t, settled, 1)
			require.NoError(t, settled[0].Err)
			assert.Equal(t, []string{"app start"}, took())
		})
		t.Run("the RoundTripper's attempts carry the request's context", func(t *testing.T) {
			ctx := idem.ContextWithAction(context.WithValue(context.Background(), callerKey{}, "request"), "refund:1")
			hr, err := http.NewRequestWithContext(ctx,
				http.MethodPost, "https://api.example/refunds", strings.NewReader("{}"))
			require.NoError(t, err)
			resp, err := (&http.Client{Transport: c.RoundTripper(rt)}).Do(hr)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, []string{"request"}, took())
		})
	})

	// The attempt hook's URL, meant for logs, carries no credential: not a
	// secret key sent as the user name with an empty password (Stripe's
	// "sk_live_...:"), not a token sent as the user name alone, not a query
	// parameter named for a credential (access_token, api_key, an AWS
	// presigned URL's signature and security token), nor a fragment. The
	// other query parameters stay, for the log to be of use.
	t.Run("its URL carries no credential", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ url, want string }{
			{"https://sk_live_51Habc:@api.example/v1/charges", "https://xxxxx@api.example/v1/charges"},
			{"https://ghp_16C7e42F292c6912E7710c83@api.example/repos", "https://xxxxx@api.example/repos"},
			{"https://shop:s3cret@api.example/payments", "https://shop:xxxxx@api.example/payments"},
			{"https://api.example/payments?cart=42&access_token=eyJhbGciOi&api_key=AIzaSy",
				"https://api.example/payments?cart=42&access_token=xxxxx&api_key=xxxxx"},
			{"https://bucket.example/o?X-Amz-Credential=AKIA%2F20261203&X-Amz-Signature=9f0e&X-Amz-Security-Token=FQoG&X-Amz-Expires=60",
				"https://bucket.example/o?X-Amz-Credential=xxxxx&X-Amz-Signature=xxxxx&X-Amz-Security-Token=xxxxx&X-Amz-Expires=60"},
			{"https://api.example/pay?sig=abc&key=AIza&Password=hunter2", "https://api.example/pay?sig=xxxxx&key=xxxxx&Password=xxxxx"},
			{"https://api.example/pay?cart=42#access_token=eyJhbGciOi", "https://api.example/pay?cart=42"},
			{"https://api.example/pay?cart=42&pass_word=hunter2", "https://api.example/pay?cart=42&pass_word=xxxxx"},
		} {
			var (
				mu  sync.Mutex
				got []string
			)
			srv := &server{answer: created}
			c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil), idem.WithAttemptHook(func(a idem.Attempt) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, a.URL)
			}))
			_, err := c.Send(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: tc.url, Body: []byte(`{}`)})
			require.NoError(t, err, tc.url)
			assert.Equal(t, []string{tc.want}, got, tc.url)
		}
	})

	// The attempt's error carries no credential either: net/http's *url.Error
	// names the request's URL, with only a password starred, so the hook's
	// Err would show what its URL hides. It stays the same error to
	// errors.Is and errors.As.
	t.Run("its error carries no credential", func(t *testing.T) {
		t.Parallel()
		for _, raw := range []string{
			"https://sk_live_51Habc:@api.example/v1/charges?cart=42",
			"https://ghp_16C7e42F292c6912E7710c83@api.example/repos",
			"https://api.example/payments?access_token=eyJhbGciOi",
		} {
			var (
				mu   sync.Mutex
				errs []error
			)
			srv := &server{answer: refused}
			c := budgetClient(t, srv, clock.NewManual(epoch), persist.NewMemory(nil),
				idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2, Jitter: -1}),
				idem.WithAttemptHook(func(a idem.Attempt) {
					mu.Lock()
					defer mu.Unlock()
					errs = append(errs, a.Err)
				}))
			_, err := c.Send(context.Background(), "checkout", idem.Request{Method: http.MethodPost, URL: raw, Body: []byte(`{}`)})
			require.Error(t, err)
			require.Len(t, errs, 2, raw)
			for _, e := range errs {
				require.Error(t, e, raw)
				for _, secret := range []string{"sk_live_51Habc", "ghp_16C7e42F292c6912E7710c83", "eyJhbGciOi"} {
					assert.NotContains(t, e.Error(), secret)
				}
				assert.Contains(t, e.Error(), "api.example/")
				assert.ErrorIs(t, e, syscall.ECONNREFUSED)
				var ue *url.Error
				assert.ErrorAs(t, e, &ue)
			}
		}
	})
}

func TestAuthorizer(t *testing.T) {
	t.Parallel()
	errNoSession := errors.New("token refresh failed")
	withAuthorizer := func(f func(context.Context, string) (string, error)) idem.Option {
		return func(c *idem.Config) { c.Authorizer = f }
	}
	t.Run("a failure before any attempt wrote ends not sent and the changed cart replaces the intent", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		c := e.newClient(t, withAuthorizer(func(context.Context, string) (string, error) { return "", errNoSession }))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrNotSent)
		require.ErrorIs(t, err, errNoSession, "the app's error is kept")
		assert.Equal(t, persist.StateNotSent, in.State())
		assert.Zero(t, e.srv.Stats().Requests)

		_, err = c.Intent(ctx, "checkout", e.paymentRequest(t, 200, "cus_1"))
		require.NoError(t, err, "the changed cart is not blocked")
		out, err := e.newClient(t).SettleAll(ctx) // the next start
		require.NoError(t, err)
		assert.Empty(t, out, "the first cart is gone")
		assert.Zero(t, e.srv.Stats().ProviderCharges)
	})
	t.Run("a failure after an attempt wrote ends with the outcome unknown", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := newEnv(t)
		var calls atomic.Int32
		c := e.newClient(t, withAuthorizer(func(context.Context, string) (string, error) {
			if calls.Add(1) > 1 {
				return "", errNoSession
			}
			return "Bearer t1", nil
		}))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.NotErrorIs(t, err, idem.ErrNotSent, "the first attempt was charged")
		assert.Equal(t, 1, e.srv.Stats().ProviderCharges)
	})
	// Path, before the check: an Authorizer that returns a token with a
	// trailing newline (read from a file or a keychain as is) made a
	// header value net/http refuses before it dials: ten pointless
	// attempts and "outcome unknown", though nothing could be sent.
	t.Run("a value net/http cannot send is a failure that never shows the value", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		for _, v := range []string{"Bearer SECRET_tok\n", "Bearer SECRET_tok\r\nX-Evil: 1", "Bearer SECRET\x00tok"} {
			e := newEnv(t)
			var calls atomic.Int32
			c := e.newClient(t, withAuthorizer(func(context.Context, string) (string, error) {
				calls.Add(1)
				return v, nil
			}))
			in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
			require.NoError(t, err)
			_, err = c.Do(ctx, in)
			require.ErrorIs(t, err, idem.ErrNotSent, "%q", v)
			assert.ErrorContains(t, err, "the Authorizer failed: its value is not a valid header field value")
			assert.NotContains(t, err.Error(), "SECRET", "the value is a credential")
			assert.Equal(t, int32(1), calls.Load(), "no retry can fix it")
			assert.Equal(t, persist.StateNotSent, in.State())
			assert.Zero(t, e.srv.Stats().Requests)
		}

		e := newEnv(t)
		var calls atomic.Int32
		c := e.newClient(t, withAuthorizer(func(context.Context, string) (string, error) {
			if calls.Add(1) > 1 {
				return "Bearer SECRET_t2\n", nil
			}
			return "Bearer t1", nil
		}))
		in, err := c.Intent(ctx, "checkout", e.paymentRequest(t, 100, "cus_1"))
		require.NoError(t, err)
		e.fault(t, fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
		_, err = c.Do(ctx, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "after an attempt wrote")
		assert.NotErrorIs(t, err, idem.ErrNotSent, "the first attempt was charged")
		assert.NotContains(t, err.Error(), "SECRET")
		assert.Equal(t, int32(2), calls.Load())
	})
	t.Run("the credentials go on each attempt and are never stored", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var saw []string
		var mu sync.Mutex
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			saw = append(saw, r.Header.Get("Authorization"))
			mu.Unlock()
			w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(srv.Close)
		store := persist.NewMemory(nil)
		c, err := idem.New(idem.Config{Store: store, Server: idem.Server{Mark: idem.MarkEcho}, Authorizer: func(_ context.Context, key string) (string, error) { return "Bearer for-" + key, nil }})
		require.NoError(t, err)
		in, err := c.Intent(ctx, "checkout", idem.Request{Method: http.MethodPost, URL: srv.URL + "/payments", Body: []byte(`{}`)})
		require.NoError(t, err)
		_, err = c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, []string{"Bearer for-" + in.Key()}, saw)
		stored, err := store.Get(ctx, in.Key())
		require.NoError(t, err)
		assert.Empty(t, stored.Header.Get("Authorization"))
	})
}

// callLine is one record the app's logger got: its level, message, and the
// value its context carried for callTraceKey.
type callLine struct {
	level slog.Level
	msg   string
	trace any
}

type callTraceKey struct{}

// callLines keeps the records at or above min.
type callLines struct {
	mu    sync.Mutex
	min   slog.Level
	lines []callLine
}

func (h *callLines) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }

func (h *callLines) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, callLine{level: r.Level, msg: r.Message, trace: ctx.Value(callTraceKey{})})
	return nil
}

func (h *callLines) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *callLines) WithGroup(string) slog.Handler      { return h }

func (h *callLines) at(level slog.Level) []callLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []callLine
	for _, l := range h.lines {
		if l.level == level {
			out = append(out, l)
		}
	}
	return out
}

func TestCallLogs(t *testing.T) {
	t.Parallel()
	traced := context.WithValue(context.Background(), callTraceKey{}, "trace-1")
	t.Run("each wait and the answer are told at INFO, with the caller's context", func(t *testing.T) {
		t.Parallel()
		h := &callLines{min: slog.LevelDebug}
		var n atomic.Int32
		c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
			if n.Add(1) < 3 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}, idem.WithLogger(slog.New(h)), idem.WithRetryPolicy(idem.RetryPolicy{InitialInterval: 3 * time.Second, Jitter: -1}))
		in, err := c.NewIntent(traced, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(traced, in)
		require.NoError(t, err)
		var infos []string
		for _, l := range h.at(slog.LevelInfo) {
			infos = append(infos, l.msg)
		}
		assert.Equal(t, []string{
			"idem: retrying in 3s, attempt 2 of 10",
			"idem: retrying in 6s, attempt 3 of 10",
			"idem: answered 201 Created after 3 attempt(s)",
		}, infos)
		assert.Len(t, h.at(slog.LevelDebug), 3, "one line per attempt")
		for _, l := range h.lines {
			assert.Equal(t, "trace-1", l.trace, "logged without the caller's context: %s", l.msg)
		}
	})
	t.Run("not sent is told, and its error says how many attempts and why it stopped", func(t *testing.T) {
		t.Parallel()
		h := &callLines{min: slog.LevelInfo}
		refused := httptest.NewServer(http.NotFoundHandler())
		refused.Close() // nothing listens there now
		c, err := idem.NewWith(idem.WithClock(clock.NewManual(epoch)), idem.WithLogger(slog.New(h)),
			idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2}))
		require.NoError(t, err)
		in, err := c.NewIntent(traced, "checkout", idem.Request{Method: http.MethodPost, URL: refused.URL, Body: []byte(`{}`)})
		require.NoError(t, err)
		_, err = c.Do(traced, in)
		require.ErrorIs(t, err, idem.ErrNotSent)
		assert.Contains(t, err.Error(), "in 2 attempt(s) (stopped: max attempts reached)")
		infos := h.at(slog.LevelInfo)
		require.NotEmpty(t, infos)
		last := infos[len(infos)-1]
		assert.Equal(t, "idem: not sent after 2 attempt(s): max attempts reached", last.msg)
		assert.Equal(t, "trace-1", last.trace)
	})
	t.Run("an outcome unknown is told at WARN with the attempts and the reason", func(t *testing.T) {
		t.Parallel()
		h := &callLines{min: slog.LevelInfo}
		c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}, idem.WithLogger(slog.New(h)), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 2}))
		in, err := c.NewIntent(traced, "checkout", req)
		require.NoError(t, err)
		_, err = c.Do(traced, in)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		warns := h.at(slog.LevelWarn)
		require.Len(t, warns, 1)
		assert.Equal(t, "idem: outcome unknown after 2 attempt(s): max attempts reached", warns[0].msg)
		assert.Equal(t, "trace-1", warns[0].trace)
	})
}

// TestCallLogsWhenQuiet is not parallel: it counts the process's
// allocations.
func TestCallLogsWhenQuiet(t *testing.T) {
	t.Run("a logger above INFO costs a payment no allocation", func(t *testing.T) {
		if raceEnabled {
			t.Skip("allocations under the race detector are not the program's; go test without -race counts them")
		}
		// payer returns a function that makes and sends one payment of a
		// Client with opts. The server answers in the caller's goroutine:
		// no connection's goroutines add allocations to the count.
		payer := func(opts ...idem.Option) func() {
			rt := roundTripFunc(func(req *http.Request) (*http.Response, error) { return answer(req, http.StatusCreated), nil })
			c, err := idem.NewWith(append([]idem.Option{idem.WithHTTPClient(&http.Client{Transport: rt})}, opts...)...)
			require.NoError(t, err)
			return func() {
				in, err := c.NewIntent(context.Background(), "", idem.Request{Method: http.MethodPost, URL: "https://api.example/payments",
					Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`)})
				require.NoError(t, err)
				_, err = c.Do(context.Background(), in)
				require.NoError(t, err)
			}
		}
		// batch returns the mean allocations of a payment over a batch.
		// The counts are the process's: goroutines another test left
		// behind only add to them.
		batch := func(pay func()) float64 {
			const n = 100
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range n {
				pay()
			}
			runtime.ReadMemStats(&after)
			return float64(after.Mallocs-before.Mallocs) / n
		}
		silentPay := payer()
		quietPay := payer(idem.WithLogger(slog.New(&callLines{min: slog.LevelWarn})))
		for range 20 {
			silentPay()
			quietPay()
		}
		// The least of batches taken in turns: the noise falls on both.
		silent, quiet := math.Inf(1), math.Inf(1)
		for range 8 {
			silent = min(silent, batch(silentPay))
			quiet = min(quiet, batch(quietPay))
		}
		assert.Less(t, quiet, silent+0.5, "allocations per payment: %.1f with no logger, %.1f with one above INFO", silent, quiet)
	})
}

// TestCallState holds the rule of call.go: the state of one call is the
// struct call, written only by the methods in that file, and found through
// a request's context only by its helpers there. It type-checks the
// package's source against the export data that go list builds.
func TestCallState(t *testing.T) {
	t.Parallel()
	fset, files, info, pkg := checkPackage(t)
	callType := pkg.Scope().Lookup("call").Type()
	isCall := func(tv types.Type) bool {
		if p, ok := tv.(*types.Pointer); ok {
			tv = p.Elem()
		}
		return types.Identical(tv, callType)
	}
	outside := func(f *ast.File) bool { return filepath.Base(fset.File(f.Pos()).Name()) != "call.go" }
	t.Run("only call.go writes it", func(t *testing.T) {
		t.Parallel()
		for _, f := range files {
			if !outside(f) {
				continue
			}
			var stack []ast.Node
			ast.Inspect(f, func(n ast.Node) bool {
				if n == nil {
					stack = stack[:len(stack)-1]
					return true
				}
				stack = append(stack, n)
				if lit, ok := n.(*ast.CompositeLit); ok && isCall(info.TypeOf(lit)) {
					t.Errorf("%s: a call is made outside call.go", fset.Position(lit.Pos()))
				}
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				s := info.Selections[sel]
				if s == nil || s.Kind() != types.FieldVal || !isCall(s.Recv()) {
					return true
				}
				if how := written(info, stack); how != "" {
					t.Errorf("%s: %s of call's field %s outside call.go", fset.Position(sel.Pos()), how, sel.Sel.Name)
				}
				return true
			})
		}
	})
	t.Run("only call.go finds it through a context", func(t *testing.T) {
		t.Parallel()
		key := pkg.Scope().Lookup("callKey")
		for id, obj := range info.Uses {
			if obj == key {
				for _, f := range files {
					if f.Pos() <= id.Pos() && id.Pos() < f.End() && outside(f) {
						t.Errorf("%s: callKey used outside call.go", fset.Position(id.Pos()))
					}
				}
			}
		}
	})
}

// written says how the field selection at the top of stack may change the
// field ("an assignment", "an increment", "an address", "a method call"),
// or "" for a read.
func written(info *types.Info, stack []ast.Node) string {
	i := len(stack) - 1
	// Climb the selections of the field's own fields (st.b.attempts).
	for i > 0 {
		sel, ok := stack[i-1].(*ast.SelectorExpr)
		if !ok || sel.X != stack[i] {
			break
		}
		if s := info.Selections[sel]; s != nil && s.Kind() == types.MethodVal {
			return "a method call"
		}
		i--
	}
	if i == 0 {
		return ""
	}
	expr := stack[i]
	switch p := stack[i-1].(type) {
	case *ast.AssignStmt:
		for _, l := range p.Lhs {
			if l == expr {
				return "an assignment"
			}
		}
	case *ast.IncDecStmt:
		return "an increment"
	case *ast.UnaryExpr:
		if p.Op == token.AND {
			return "an address"
		}
	}
	return ""
}

// checkPackage type-checks the package's source files, without its tests.
func checkPackage(t *testing.T) (*token.FileSet, []*ast.File, *types.Info, *types.Package) {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", ".").Output()
	require.NoError(t, err)
	exports := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if p, e, ok := strings.Cut(line, " "); ok && e != "" {
			exports[p] = e
		}
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		if f.Name.Name == "idem" {
			files = append(files, f)
		}
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })}
	pkg, err := conf.Check("github.com/idemkit/idem", fset, files, info)
	require.NoError(t, err)
	return fset, files, info, pkg
}

// TestSendGate checks the gate each attempt passes as its connection
// arrives (sendGate). The phone sleeps while an attempt dials: Go's clocks
// stop, the clock that counts sleep goes on (goClock). Meanwhile the app's
// long-lived Client B voids the intent, and the app pays again. The
// sleeping attempt must never reach the server whole. The subtest in
// TestReconcile ("... sleeps mid-dial ...") is the plain HTTP/1 case.
func TestSendGate(t *testing.T) {
	t.Parallel()
	t.Run("over HTTP/2 only the head leaves", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w, h, hs := newSleepWorldH2(t)
		base := hs.Client().Transport.(*http.Transport).Clone()
		t.Cleanup(base.CloseIdleConnections)
		dialing := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPost {
				w.sleep(t)
			}
			resp, err := base.RoundTrip(req)
			if resp != nil {
				t.Logf("A's attempt: %s %s proto %s", req.Method, req.URL.Path, resp.Proto)
			} else {
				t.Logf("A's attempt: %s %s err %v", req.Method, req.URL.Path, err)
			}
			return resp, err
		})
		a := w.clientA(t, &http.Client{Transport: dialing}, echoLookupServer)
		req, err := idem.JSONRequest(http.MethodPost, hs.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := a.Intent(ctx, "checkout", req)
		require.NoError(t, err)
		w.key = in.Key()
		resp, err := a.Do(ctx, in)
		t.Logf("A's Do: resp %v, err %v, state %s", resp != nil, err, in.State())
		require.True(t, w.voided, "the setup: B voided the intent while A slept")
		require.NoError(t, w.paid, "the setup: told void, the app paid the changed cart")
		st := h.Stats()
		t.Logf("server: %+v", st)
		assert.Equal(t, 1, st.ProviderCharges, "two charges for one checkout")
		if err == nil {
			assert.NotEqual(t, persist.StateSucceeded, in.State(), "A is told paid for the voided intent")
		}
	})
	// The first attempt charges and its answer is lost. The app resumes the
	// intent over HTTP/2, and the phone sleeps while dialing, past the send
	// deadline. The head leaves with an empty body. The server answers that
	// head with a final 400 with the key's echo, as a server that cannot
	// read a body may (idem's middleware answers 408). That answer is about
	// a request idem cut on purpose: it is discarded, never stored as the
	// intent's failure. A later Settle gets the server's replay.
	t.Run("over HTTP/2 an answer to the cut head is discarded", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		truth := clock.NewManual(phoneEpoch)
		h := fakeserver.NewHandler(&fakeserver.Options{Clock: truth})
		hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
				http.Error(w, "the request body could not be read", http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			h.ServeHTTP(w, r)
		}))
		hs.EnableHTTP2 = true
		hs.StartTLS()
		t.Cleanup(hs.Close)
		store := dirStore(t, filepath.Join(t.TempDir(), "store"))
		t.Cleanup(func() { store.Close() })
		phone := &goClock{m: truth}

		base := hs.Client().Transport.(*http.Transport).Clone()
		t.Cleanup(base.CloseIdleConnections)
		var nap atomic.Bool
		base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if nap.CompareAndSwap(true, false) {
				phone.napNow(time.Hour) // the phone sleeps while the connection is dialed
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		var protos []string
		hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := base.RoundTrip(r)
			if resp != nil {
				protos = append(protos, r.Method+" "+resp.Proto+" "+resp.Status)
			}
			return resp, err
		})}
		a, err := idem.New(idem.Config{Store: store, HTTPClient: hc, Server: echoLookupServer, Clock: phone,
			RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, hs.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		in, err := a.Intent(ctx, "checkout", req)
		require.NoError(t, err)

		require.NoError(t, h.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key(), Count: 1}))
		_, err = a.Do(ctx, in)
		t.Logf("first Do: err %v, state %s", err, in.State())
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the setup: charged, answer lost")
		require.Equal(t, 1, h.Stats().ProviderCharges, "the setup: the first attempt charged")

		base.CloseIdleConnections()
		nap.Store(true)
		resp, err := a.Do(ctx, in)
		t.Logf("answers: %v", protos)
		t.Logf("resumed Do: resp %v, err %v, state %s", resp != nil, err, in.State())
		require.Equal(t, 1, h.Stats().ProviderCharges)
		assert.NotEqual(t, persist.StateFailed, in.State(), "an intent the server charged is stored failed")
		if err != nil {
			// Not sent whole, the outcome stays unknown; or the server's replay.
			assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the outcome of the charged intent is told as a final failure")
		}
		later, err := a.Load(ctx, in.Key())
		require.NoError(t, err)
		resp, err = a.Settle(ctx, later)
		t.Logf("Settle: resp %v, err %v, state %s", resp != nil, err, later.State())
		assert.Equal(t, persist.StateSucceeded, later.State(), "Settle tells failed for a payment the server made")
	})
	t.Run("through the RoundTripper", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newSleepWorld(t, echoLookupServer, nil)
		dialing := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPost {
				w.sleep(t)
			}
			return w.srv.Client().Transport.RoundTrip(req)
		})
		a := w.clientA(t, &http.Client{}, echoLookupServer)
		hc := &http.Client{Transport: a.RoundTripper(dialing)}
		req, err := http.NewRequestWithContext(idem.ContextWithAction(ctx, "checkout"), http.MethodPost, w.srv.URL+"/payments",
			strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		// The key is known once the RoundTripper arms the intent: B finds it in the store.
		w.key = ""
		findKey := func() {
			ins, err := w.b.Unresolved(ctx)
			if err == nil && len(ins) == 1 {
				w.key = ins[0].Key()
			}
		}
		dialing2 := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPost && w.key == "" {
				findKey()
			}
			return dialing(r)
		})
		hc.Transport = a.RoundTripper(dialing2)
		resp, err := hc.Do(req)
		if resp != nil {
			resp.Body.Close()
		}
		t.Logf("A's RoundTrip: resp %v, err %v", resp != nil, err)
		require.True(t, w.voided, "the setup: B voided the intent while A slept")
		require.NoError(t, w.paid, "the setup: told void, the app paid the changed cart")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges, "two charges for one checkout")
	})
	t.Run("net/http's own resend on a new connection is gated too", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := newSleepWorld(t, echoLookupServer, nil)
		var dials atomic.Int32
		var armed atomic.Bool
		// The keep-alive connection's first Write (the app's own GET) passes,
		// its second (the POST) fails with nothing written; net/http resends
		// on a new connection, whose dial spans the suspend.
		tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			n := dials.Add(1)
			if armed.Load() {
				w.sleep(t)
			}
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if n == 1 {
				return &failSecondWrite{Conn: c}, nil
			}
			return c, nil
		}}
		t.Cleanup(tr.CloseIdleConnections)
		warm := &http.Client{Transport: tr}
		g, err := warm.Get(w.srv.URL + "/payments")
		require.NoError(t, err)
		io.Copy(io.Discard, g.Body)
		g.Body.Close()
		armed.Store(true)
		a := w.clientA(t, &http.Client{Transport: tr}, echoLookupServer)
		in, err := a.Intent(ctx, "checkout", payment1500(t, w.srv))
		require.NoError(t, err)
		w.key = in.Key()
		resp, err := a.Do(ctx, in)
		t.Logf("A's Do: resp %v, err %v, state %s, dials %d", resp != nil, err, in.State(), dials.Load())
		require.True(t, w.voided, "the setup: B voided the intent while A slept")
		require.NoError(t, w.paid, "the setup: told void, the app paid the changed cart")
		assert.Equal(t, 1, w.srv.Stats().ProviderCharges, "two charges for one checkout")
	})
}

// sleepWorld is the world of the sleeping phone: a true clock, the fake
// server, a real file store shared by B (the app's long-lived Client, an
// hour old) and A (the phone's Client on goClock, made by the test).
type sleepWorld struct {
	truth *clock.Manual
	srv   *fakeserver.Server
	store *persist.FileStore
	b     *idem.Client
	phone *goClock
	key   string

	once    sync.Once
	voided  bool
	paid    error
	payment func() (idem.Request, error) // the changed cart the app pays once told void
	name    string
	napFor  time.Duration // how long the phone sleeps; zero means an hour
}

func newSleepWorld(t *testing.T, server idem.Server, opts *fakeserver.Options) *sleepWorld {
	t.Helper()
	truth := clock.NewManual(phoneEpoch)
	if opts == nil {
		opts = &fakeserver.Options{}
	}
	opts.Clock = truth
	srv := fakeserver.NewServer(opts)
	t.Cleanup(srv.Close)
	store := dirStore(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { store.Close() })
	b, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: server, Clock: truth})
	require.NoError(t, err)
	truth.Advance(time.Hour) // B is the app's long-lived Client
	w := &sleepWorld{truth: truth, srv: srv, store: store, b: b, phone: &goClock{m: truth}, name: "checkout"}
	w.payment = func() (idem.Request, error) {
		return idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_1"})
	}
	return w
}

// sleep is the phone falling asleep for an hour, once, at the moment the
// test chooses. While it sleeps, B reconciles the intent on waking (as the
// reconcile_test.go model does); told void, the app pays the changed cart.
func (w *sleepWorld) sleep(t *testing.T) {
	w.once.Do(func() {
		ctx := context.Background()
		nap := w.napFor
		if nap == 0 {
			nap = time.Hour
		}
		w.phone.napNow(nap)
		loaded, err := w.b.Load(ctx, w.key)
		if err != nil {
			t.Errorf("B's load: %v", err)
			return
		}
		_, err = w.b.Reconcile(ctx, loaded)
		t.Logf("B's reconcile while A sleeps: state %s, err %v", loaded.State(), err)
		if w.voided = loaded.State() == persist.StateVoid; w.voided {
			req, err := w.payment()
			if err != nil {
				w.paid = err
				return
			}
			in2, err := w.b.NewIntent(ctx, w.name, req)
			if err == nil {
				_, err = w.b.Do(ctx, in2)
			}
			w.paid = err
		}
	})
}

// clientA is the phone's Client, through hc, one attempt per call.
func (w *sleepWorld) clientA(t *testing.T, hc *http.Client, server idem.Server) *idem.Client {
	t.Helper()
	a, err := idem.New(idem.Config{Store: w.store, HTTPClient: hc, Server: server, Clock: w.phone,
		RetryPolicy: idem.RetryPolicy{MaxAttempts: 1}})
	require.NoError(t, err)
	return a
}

// rtTLSWorld is newSleepWorld over HTTPS with HTTP/2 enabled: the fake
// server's handler behind httptest's TLS server.
func newSleepWorldH2(t *testing.T) (*sleepWorld, *fakeserver.Handler, *httptest.Server) {
	t.Helper()
	truth := clock.NewManual(phoneEpoch)
	h := fakeserver.NewHandler(&fakeserver.Options{Clock: truth})
	hs := httptest.NewUnstartedServer(h)
	hs.EnableHTTP2 = true
	hs.StartTLS()
	t.Cleanup(hs.Close)
	store := dirStore(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { store.Close() })
	b, err := idem.New(idem.Config{Store: store, HTTPClient: hs.Client(), Server: echoLookupServer, Clock: truth})
	require.NoError(t, err)
	truth.Advance(time.Hour)
	w := &sleepWorld{truth: truth, store: store, b: b, phone: &goClock{m: truth}, name: "checkout"}
	w.payment = func() (idem.Request, error) {
		return idem.JSONRequest(http.MethodPost, hs.URL+"/payments", map[string]any{"amount": 1600, "currency": "AZN", "customer": "cus_1"})
	}
	return w, h, hs
}

// failSecondWrite fails its second Write with nothing written.
type failSecondWrite struct {
	net.Conn
	n atomic.Int32
}

func (c *failSecondWrite) Write(p []byte) (int, error) {
	if c.n.Add(1) == 2 {
		c.Conn.Close()
		return 0, syscall.EPIPE
	}
	return c.Conn.Write(p)
}
