package idem_test

// Red-team findings against the client with a FileStore in t.TempDir().
// Each test is named for the promise it breaks and fails while the
// finding stands.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// rtSend opens the store in dir, makes a Client and Sends req for
// action within d, then closes the store: one run of the app.
func rtSend(t *testing.T, dir, action string, req idem.Request, d time.Duration) (*idem.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	store, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	c, err := idem.New(idem.Config{Store: store, Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
	require.NoError(t, err)
	return c.Send(ctx, action, req)
}

func rtPayment(t *testing.T, base string) idem.Request {
	t.Helper()
	req, err := idem.JSONRequest(http.MethodPost, base+"/payments",
		map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	return req
}

// TestSameBytesOnEveryAttempt_HeaderNotUTF8: the client retries with the
// same key and the same bytes, across restarts.
//
// Path to the failure: the request carries "X-Note: caf\xe9" (obs-text,
// which Request's checks and net/http accept and send). The first run's
// attempts all lose their answers (a proxy cuts each connection after the
// server charged), so the intent is left unresolved. The next OpenDir
// scans the files (modelled here by removing the index: a kill before the
// store rewrote it, a damaged index, or an upgrade whose index version
// differs). The FileStore wrote the
// header through json.Marshal, which replaced the byte with U+FFFD, so
// the next run resumes the intent with "caf\xef\xbf\xbd": not the bytes of
// the first attempt. Here the fake server fingerprints the body only and
// replays; a server that fingerprints the header answers the resume as a
// key reused for another request.
func TestSameBytesOnEveryAttempt_HeaderNotUTF8(t *testing.T) {
	srv := fakeserver.NewServer(nil)
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	var cut atomic.Bool
	cut.Store(true)
	var mu sync.Mutex
	var seen []string
	px := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Note"))
		mu.Unlock()
		if cut.Load() {
			rp.ServeHTTP(httptest.NewRecorder(), r) // the server does the work
			panic(http.ErrAbortHandler)             // the answer is lost
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(px.Close)
	dir := filepath.Join(t.TempDir(), "idem")
	req := rtPayment(t, px.URL)
	req.Header = http.Header{"X-Note": {"caf\xe9"}}

	_, err = rtSend(t, dir, "checkout:cart-7", req, 2*time.Second)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	// The next start scans: no usable index.
	require.NoError(t, os.Remove(filepath.Join(dir, "index")))
	cut.Store(false)
	_, err = rtSend(t, dir, "checkout:cart-7", req, 5*time.Second)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(seen), 2)
	for i, v := range seen {
		if v != "caf\xe9" {
			t.Errorf("attempt %d sent X-Note %q, the first sent %q: a resume after the restart sends other bytes (all: %q)", i+1, v, "caf\xe9", seen)
		}
	}
}

// TestBadInputLosesNothing_ActionNameNotUTF8: bad input gets a clear
// error and loses nothing; what the app is told is true.
//
// Path to the failure: Send for the action "checkout:caf\xe9" (a name built
// from Latin-1 input) is accepted and paid. The FileStore wrote the
// record's Name through json.Marshal, which replaced the byte with
// U+FFFD, so the record no longer belongs to its file's name tag: the
// next Send of the same request is refused with "cannot tell whether an
// earlier intent is unresolved" and a *CorruptError. The paid answer is
// lost, the app is told its store is damaged, and the documented fix
// (Quarantine the file) leaves the action with no intent, so the next
// Send pays again.
func TestBadInputLosesNothing_ActionNameNotUTF8(t *testing.T) {
	srv := fakeserver.NewServer(nil)
	t.Cleanup(srv.Close)
	dir := filepath.Join(t.TempDir(), "idem")
	const action = "checkout:caf\xe9"
	req := rtPayment(t, srv.URL)
	first, err := rtSend(t, dir, action, req, 5*time.Second)
	if err != nil {
		return // refused with an error at the start: the promise holds
	}
	require.Equal(t, 201, first.StatusCode)
	again, err := rtSend(t, dir, action, req, 5*time.Second)
	require.NoError(t, err, "the action's paid answer, from the store: the Name was accepted at the first Send and is unreadable now")
	require.True(t, again.FromStore)
	require.Equal(t, 1, srv.Stats().ProviderCharges)
}
