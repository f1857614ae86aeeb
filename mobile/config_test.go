package mobile

import (
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

// A Config names how the server marks its answers: Open refuses one
// without a mark, or with a mark that is no choice, in the facade's own
// words, and a plain server declared "json-id" is paid while a captive
// portal in front of it is not.
func TestConfigMark(t *testing.T) {
	t.Parallel()
	t.Run("Open refuses a Config without a mark and names the choices", func(t *testing.T) {
		t.Parallel()
		for _, mark := range []string{"", "Echo", "json"} {
			cfg := NewConfig(stateDir(t), "https://api.example.com")
			cfg.Mark = mark
			_, err := Open(cfg)
			require.Error(t, err, "%q", mark)
			assert.Equal(t, kindConfig, ErrorKind(err))
			for _, w := range []string{"Mark", `"echo"`, `"stripe"`, `"adyen"`, `"increase"`, `"json-id"`, "never settles a payment"} {
				assert.Contains(t, err.Error(), w, "%q", mark)
			}
		}
	})
	t.Run("Open refuses an id path with an empty segment", func(t *testing.T) {
		t.Parallel()
		cfg := NewConfig(stateDir(t), "https://api.example.com")
		cfg.Mark, cfg.MarkIDPath = "json-id", "data."
		_, err := Open(cfg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `MarkIDPath "data."`)
	})

	// A plain server: it keeps its payments by key but echoes nothing.
	// portal, when set, answers in its place.
	plain := func(t *testing.T, portal bool) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if portal {
				w.Header().Set("Content-Type", "text/html")
				_, _ = io.WriteString(w, "<html><body>Accept the terms to use the Wi-Fi</body></html>")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"data":{"id":"pay_1","amount":1500}}`)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	for _, tc := range []struct {
		name   string
		portal bool
		want   string
	}{
		{"a plain server's answer carrying the id is paid", false, OutcomeSucceeded},
		{"a captive portal's page in front of it is not", true, OutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := NewConfig(stateDir(t), plain(t, tc.portal))
			cfg.Mark, cfg.MarkIDPath, cfg.MaxAttempts = "json-id", "data.id", 1
			c, err := Open(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			res, err := c.Pay("checkout:cart-1", "/payments", []byte(cart), nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, res.Outcome)
		})
	}

	// Path: Pay's first attempt passes a WAF with a response-phase rule;
	// the server charges and answers 201, and the WAF swaps the answer for
	// its own 403 page, which carries no echo of the key. Were an unmarked
	// 4xx final on a first attempt, Pay would return OutcomeFailed ("a
	// declined card; PayAnew starts a new payment"): the app offers
	// PayAnew and the user is charged twice.
	t.Run("a WAF's 403 that replaced the server's 201 is unknown", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewServer(nil)
		defer srv.Close()
		u, _ := url.Parse(srv.URL)
		proxy := httputil.NewSingleHostReverseProxy(u)
		proxy.ModifyResponse = func(resp *http.Response) error {
			resp.Body.Close()
			body := "<html><body>Request blocked by security policy</body></html>"
			resp.StatusCode, resp.Status = http.StatusForbidden, "403 Forbidden"
			resp.Header = http.Header{"Content-Type": {"text/html"}}
			resp.Body = io.NopCloser(strings.NewReader(body))
			resp.ContentLength = int64(len(body))
			return nil
		}
		waf := httptest.NewServer(proxy)
		defer waf.Close()
		cfg := NewConfig(stateDir(t), waf.URL)
		cfg.Mark = "echo"
		c, err := Open(cfg)
		require.NoError(t, err)
		defer c.Close()
		res, err := c.Pay("checkout:cart-1", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		require.Equal(t, 1, srv.Stats().ProviderCharges, "setup: the server charged")
		assert.Equal(t, OutcomeUnknown, res.Outcome, "the card was charged: Kind %q Status %d", res.Kind, res.Status)
	})

	// Path: a captive portal answers the POST with 307 to its own JSON API
	// on another host; the facade's http.Client follows it with the same
	// method and body, and the portal's 200 {"id": "sess_..."} would be
	// taken by the json-id mark for the created payment: a receipt for a
	// payment the server never saw.
	t.Run("a portal's JSON after a redirect to another host is not a payment", func(t *testing.T) {
		t.Parallel()
		portalAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"sess_8f2c","status":"login_required"}`))
		}))
		defer portalAPI.Close()
		portal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, portalAPI.URL+"/api/v1/sessions", http.StatusTemporaryRedirect)
		}))
		defer portal.Close()
		cfg := NewConfig(stateDir(t), portal.URL)
		cfg.Mark = "json-id"
		c, err := Open(cfg)
		require.NoError(t, err)
		defer c.Close()
		res, err := c.Pay("checkout:cart-2", "/payments", []byte(cart), nil)
		require.NoError(t, err)
		assert.Equal(t, OutcomeUnknown, res.Outcome, "the portal's answer is no payment: Status %d Body %s", res.Status, res.Body)
	})
}

// TestConfig checks what Open takes from a Config and what it refuses.
func TestConfig(t *testing.T) {
	t.Run("Open refuses a bad Config", func(t *testing.T) {
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
	})

	// The error of a refused BaseURL names it without the credentials it may
	// carry: a user name and password, a query's values, a fragment; one that
	// does not parse is not named at all.
	t.Run("a refused BaseURL is named without its credentials", func(t *testing.T) {
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
	})

	// Open takes a copy of the Config: its Listener and Authorizer are the
	// Client's for its life, and a change to the Config after Open changes no
	// Client.
	t.Run("Open keeps the Config's Listener and Authorizer", func(t *testing.T) {
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
	})
}
