package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// TestMain runs the real program when a test starts this binary as a
// child process, so that -crash can exit as it does for a user.
func TestMain(m *testing.M) {
	if os.Getenv("CHECKOUT_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// runChild runs the program in a new process and returns its output and
// exit status.
func runChild(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CHECKOUT_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	}
	require.NoError(t, err, "%s", out)
	return string(out), 0
}

// records returns the intents saved in dir.
func records(t *testing.T, dir string) []*persist.Record {
	t.Helper()
	store, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	defer store.Close()
	recs, err := store.List(context.Background(), persist.Filter{})
	require.NoError(t, err)
	return recs
}

// TestProgram checks the program as a user runs it.
func TestProgram(t *testing.T) {
	// The README's quick start: one run, in process, pays each order once.
	t.Run("the quick start pays each order once", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		require.NoError(t, run(context.Background(), nil, &out, io.Discard))
		s := out.String()
		assert.Contains(t, s, "attempt 1: no answer")
		assert.Contains(t, s, "crash: the app stops here")
		assert.Contains(t, s, "unresolved intent checkout:order-1-b from an earlier run")
		assert.Contains(t, s, "server: 2 payments, 2 provider charges")
	})

	// The two-run crash against a separate server: the first run dies between
	// send and answer, the second run of the same command resumes the intent
	// with the same key, and the card is charged once.
	t.Run("a second run resumes the intent the first crashed on", func(t *testing.T) {
		t.Parallel()
		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)
		state := filepath.Join(t.TempDir(), "state")
		args := []string{"-server", srv.URL, "-state", state, "-crash"}

		out, code := runChild(t, args...)
		require.Equal(t, crashExitCode, code, out)
		assert.Contains(t, out, "crash: the process exits now")
		assert.Equal(t, 1, srv.Stats().ProviderCharges, "the server did the work; the answer was lost")
		recs := records(t, state)
		require.Len(t, recs, 1)
		require.False(t, recs[0].State.Resolved(), "the intent outlives the crash, unresolved")
		key := recs[0].Key

		var second bytes.Buffer
		require.NoError(t, run(context.Background(), args, &second, io.Discard))
		assert.Contains(t, second.String(), "unresolved intent checkout:order-1 from an earlier run: key "+key)
		st := srv.Stats()
		assert.Equal(t, 1, st.ProviderCharges, "charged once")
		assert.Equal(t, 1, st.Payments)
		recs = records(t, state)
		require.Len(t, recs, 1)
		assert.Equal(t, key, recs[0].Key)
		assert.Equal(t, persist.StateSucceeded, recs[0].State)

		// A third run finds the order paid and sends nothing.
		requests := st.Requests
		require.NoError(t, run(context.Background(), args, io.Discard, io.Discard))
		assert.Equal(t, requests, srv.Stats().Requests)
	})

	// A server without the fake's admin endpoints, as a real API: no faults,
	// no counts, and the token goes in the transport, not the stored intent.
	t.Run("a real server gets the token in the transport", func(t *testing.T) {
		fake := fakeserver.NewHandler(nil)
		var auth []string
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/_fake/") {
				http.NotFound(w, r)
				return
			}
			auth = append(auth, r.Header.Get("Authorization"))
			fake.ServeHTTP(w, r)
		}))
		defer api.Close()
		t.Setenv("CHECKOUT_TOKEN", "sk_test_1")
		state := filepath.Join(t.TempDir(), "state")

		var out bytes.Buffer
		require.NoError(t, run(context.Background(), []string{"-server", api.URL, "-state", state}, &out, io.Discard))
		assert.Contains(t, out.String(), "no /_fake/stats")
		assert.Contains(t, out.String(), "paid: 201")
		assert.Equal(t, []string{"Bearer sk_test_1"}, auth)
		assert.Equal(t, 1, fake.Stats().ProviderCharges)
		recs := records(t, state)
		require.Len(t, recs, 1)
		assert.Empty(t, recs[0].Header.Get("Authorization"), "no credentials on the device")
	})
}

func TestFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-crash"},
		{"-server", "localhost:8080"},
		{"-amount", "0"},
		{"extra"},
	} {
		err := run(context.Background(), args, io.Discard, io.Discard)
		var u usageError
		assert.ErrorAs(t, err, &u, "%q", args)
	}
	assert.NoError(t, run(context.Background(), []string{"-h"}, io.Discard, io.Discard))
}

// TestState checks where the program keeps its intents.
func TestState(t *testing.T) {
	// A run against a server keeps its intents in the user's configuration
	// directory, never in the cache directory, which the system may clear.
	t.Run("is kept in the configuration directory", func(t *testing.T) {
		home := t.TempDir()
		t.Setenv("HOME", home)
		t.Setenv("XDG_CACHE_HOME", filepath.Join(home, "cache"))
		t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, "config"))
		srv := fakeserver.NewServer(nil)
		t.Cleanup(srv.Close)

		var out bytes.Buffer
		require.NoError(t, run(context.Background(), []string{"-server", srv.URL}, &out, io.Discard))
		state := filepath.Join(home, "config", "idem-checkout")
		assert.Contains(t, out.String(), "state:  "+state)
		assert.Len(t, records(t, state), 1)
		_, err := os.Stat(filepath.Join(home, "cache"))
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
}
