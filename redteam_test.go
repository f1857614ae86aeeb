package idem_test

// Red-team findings against the client on a real FileStore in
// t.TempDir(), through the public API only.

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// rtPay makes n payments of action names prefix+i in the store in dir,
// then closes it. With lost set, the first one's answer (on a fresh connection, which
// net/http's transport does not retry by itself) is lost and the
// call gives up after one attempt: its outcome is unknown.
func rtPay(t *testing.T, srv *fakeserver.Server, dir, prefix string, n int, lost bool) {
	t.Helper()
	ctx := context.Background()
	store, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	// No lookup in this run, so a lost answer stays unknown.
	c, err := idem.New(idem.Config{Store: store,
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		Server:     idem.Server{Mark: idem.MarkEcho}})
	require.NoError(t, err)
	for i := range n {
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
			map[string]any{"amount": 100 + i, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		callCtx := ctx
		if lost && i == 0 {
			require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))
			callCtx = idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1})
		}
		_, err = c.Send(callCtx, prefix+string(rune('a'+i)), req)
		if lost && i == 0 {
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		} else {
			require.NoError(t, err)
		}
	}
	require.NoError(t, store.Close())
}

// TestSettleAllFindsEveryUnresolvedIntentAfterIndexCopiedFromAnotherStore
// breaks "never lose an intent" and the persist docs' "The store does not
// use an index ... copied from another store".
//
// Path to the failure: device store B holds two paid intents and one
// whose answer was lost (pending, outcome unknown, card charged). Another
// store A of the same app (a second account's directory, say) holds three
// paid intents; its index lists no file, only the count 3. A's index is
// copied over B's (a migration or a restore of the wrong file). At the
// next start, OpenDir(B) has nothing to stamp, the listing counts 3 record
// files as the index did, and every file the index does not hold is taken
// for resolved unread. Client.Unresolved and SettleAll return nothing:
// the charged payment is never settled or shown, start after start, as
// the copied index stays in place while nothing changes.
func TestSettleAllFindsEveryUnresolvedIntentAfterIndexCopiedFromAnotherStore(t *testing.T) {
	srv := fakeserver.NewServer(nil)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	a := filepath.Join(t.TempDir(), "store-a")
	b := filepath.Join(t.TempDir(), "store-b")
	rtPay(t, srv, a, "a:", 3, false)
	rtPay(t, srv, b, "b:", 3, true)

	idx, err := os.ReadFile(filepath.Join(a, "index"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(b, "index"), idx, 0o600))

	store, err := persist.OpenDir(b, nil)
	require.NoError(t, err)
	defer store.Close()
	c, err := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(),
		Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
	require.NoError(t, err)
	// Let the store's background listing end, as it does at any start.
	_, err = store.Get(ctx, "no-such-key")
	require.True(t, errors.Is(err, persist.ErrNotFound))

	settled, err := c.SettleAll(ctx)
	require.NoError(t, err)
	if len(settled) != 1 {
		t.Fatalf("SettleAll settled %d intents; the payment whose answer was lost (b:a) is hidden and never settled", len(settled))
	}
}
