package idem_test

// Red-team findings against the client with a FileStore in t.TempDir().
// Each test is named for the promise it breaks and fails while the
// finding stands.

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// rtRecordFile returns the name of the file in dir holding key, and its
// content.
func rtRecordFile(t *testing.T, dir, key string) (string, []byte) {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, de := range des {
		if filepath.Ext(de.Name()) != ".json" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, de.Name()))
		require.NoError(t, err)
		if bytes.Contains(data, []byte(`"key":"`+key+`"`)) {
			return de.Name(), data
		}
	}
	t.Fatalf("no file of key %q in %s", key, dir)
	return "", nil
}

// TestNeverTwice_SecondFileOfAKeyHidesThePaidAction: one user action is
// charged at most once.
//
// Path to the failure: Send pays "checkout:cart-42" (file
// k-K.<tag of checkout:cart-42>.json). A second file of the same key K
// appears in the store's directory whose name sorts first (a copy of the
// intent under the name the action had in an earlier version of the app:
// restored from a backup, or left by the previous build's cut-short change
// of Name). The FileStore gives K to the first file in name order and
// makes the action's own file a stray file, which List{Name} neither
// returns nor reports; so the next Send of the same request finds no
// intent for the action, claims a new one with a new key and the server
// charges a second time.
func TestNeverTwice_SecondFileOfAKeyHidesThePaidAction(t *testing.T) {
	ctx := context.Background()
	srv := fakeserver.NewServer(nil)
	t.Cleanup(srv.Close)
	dir := filepath.Join(t.TempDir(), "idem")
	const action = "checkout:cart-42"

	send := func() (*idem.Response, error) {
		store, err := persist.OpenDir(dir, nil)
		require.NoError(t, err)
		defer func() { require.NoError(t, store.Close()) }()
		c, err := idem.New(idem.Config{Store: store, Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"}})
		require.NoError(t, err)
		req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
			map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
		require.NoError(t, err)
		return c.Send(ctx, action, req)
	}
	resp, err := send()
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	require.Equal(t, 1, srv.Stats().ProviderCharges)

	// The key of the paid intent, and its file.
	store, err := persist.OpenDir(dir, nil)
	require.NoError(t, err)
	recs, err := store.List(ctx, persist.Filter{Name: action})
	require.NoError(t, err)
	require.Len(t, recs, 1)
	paid := recs[0]
	require.NoError(t, store.Close())
	own, _ := rtRecordFile(t, dir, paid.Key)

	// The same intent under an earlier name of the action, whose file
	// sorts before the action's own.
	for i := 0; ; i++ {
		require.Less(t, i, 500)
		older := paid.Clone()
		older.Name = "cart:42:v" + strconv.Itoa(i)
		older.Rev = ""
		odir := filepath.Join(t.TempDir(), "older")
		ostore, err := persist.OpenDir(odir, nil)
		require.NoError(t, err)
		require.NoError(t, persisttest.Put(ctx, ostore, older))
		require.NoError(t, ostore.Close())
		name, data := rtRecordFile(t, odir, paid.Key)
		if name < own {
			require.NoError(t, writeFile(filepath.Join(dir, name), data))
			break
		}
	}

	resp, err = send()
	charges := srv.Stats().ProviderCharges
	if charges != 1 {
		t.Fatalf("the paid action was charged %d times: the second Send (err %v, status %v) found no intent for %q, for its file %s became a stray second file of the key, and paid again with a new key", charges, err, statusOf(resp), action, own)
	}
	require.NoError(t, err)
	require.True(t, resp.FromStore, "the stored answer, nothing sent")
}

func statusOf(r *idem.Response) any {
	if r == nil {
		return nil
	}
	return r.StatusCode
}

func writeFile(path string, data []byte) error {
	return os.WriteFile(path, data, 0o600)
}
