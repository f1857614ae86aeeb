package idem_test

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResponse keeps what the device keeps of a final answer: its status
// always, its body within the limit, its needed header fields alone.
func TestResponse(t *testing.T) {
	t.Parallel()

	// A final answer larger than WithMaxResponseBytes still resolves the
	// intent from its status, which is known; its body is not kept, and the
	// Response says so. A later Do reads it from the store and sends nothing.
	t.Run("an answer over the limit resolves the intent without its body", func(t *testing.T) {
		t.Parallel()
		c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/payments/pay_1")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"id":"pay_1","pad":"` + strings.Repeat("x", 4096) + `"}`))
		}, idem.WithMaxResponseBytes(1024))
		ctx := context.Background()
		in, err := c.NewIntent(ctx, "", req)
		require.NoError(t, err)

		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.True(t, resp.Oversized)
		assert.Nil(t, resp.Body)
		assert.Equal(t, "/payments/pay_1", resp.Header.Get("Location"))
		assert.Equal(t, persist.StateSucceeded, in.State())

		again, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.True(t, again.FromStore)
		assert.True(t, again.Oversized)
		assert.Equal(t, http.StatusCreated, again.StatusCode)
		assert.Equal(t, 1, resp.Attempts+again.Attempts, "one request in all")
	})

	// An answer's header fields count against WithMaxResponseBytes with its
	// body: 10,000 fields of 900 bytes make an oversized answer, of which the
	// device keeps only the stored fields.
	t.Run("header fields count against the limit", func(t *testing.T) {
		t.Parallel()
		store, dir := storeDir(t, nil)
		pad := strings.Repeat("p", 900)
		c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
			for i := range 10000 {
				w.Header().Set(fmt.Sprintf("X-Pad-%d", i), pad)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"id":"pay_1"}`))
		}, idem.WithMaxResponseBytes(1024), idem.WithStore(store))
		ctx := context.Background()
		in, err := c.NewIntent(ctx, "", req)
		require.NoError(t, err)

		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.True(t, resp.Oversized)
		assert.Equal(t, []string{"Content-Type"}, slices.Sorted(maps.Keys(resp.Header)), "only the stored fields")
		assert.Equal(t, persist.StateSucceeded, in.State())
		// Closed first: its background work (the listing after open, the
		// index written at rest) then no longer changes dir.
		require.NoError(t, store.Close())
		n := storedBytes(t, dir)
		t.Logf("stored for an answer of 10,000 header fields of 900 bytes: %d bytes", n)
		assert.Less(t, n, int64(4096))
	})

	// Of a final answer's header fields, the device keeps only those a replay
	// and the app need, and those the app names; cookies and tokens stay off
	// the disk, with or without bodies.
	t.Run("only the needed and named header fields are stored", func(t *testing.T) {
		t.Parallel()
		store, dir := storeDir(t, &persist.Options{DiscardResponseBodies: true})
		c, req := answering(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/payments/pay_1")
			w.Header().Set("X-Request-Id", "req-7")
			w.Header().Set("Set-Cookie", "session=secret-cookie")
			w.Header().Set("X-Auth-Token", "secret-token")
			w.WriteHeader(http.StatusCreated)
		}, idem.WithStore(store), idem.WithServer(idem.Server{Mark: idem.MarkEcho, Lookup: contractLookup, StoredHeaders: []string{"x-request-id"}}))
		ctx := context.Background()
		in, err := c.NewIntent(ctx, "", req)
		require.NoError(t, err)

		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, "session=secret-cookie", resp.Header.Get("Set-Cookie"), "the call's own Response has every field")

		rec, err := store.Get(ctx, in.Key())
		require.NoError(t, err)
		require.NotNil(t, rec.Response)
		assert.Equal(t, http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/payments/pay_1"},
			"X-Request-Id": {"req-7"},
		}, rec.Response.Header)
		// Every file of the store, its index included, once the store is
		// closed: its background work then no longer changes dir, and Close
		// has written the index.
		require.NoError(t, store.Close())
		err = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.NotContains(t, string(b), "secret", path)
			return nil
		})
		require.NoError(t, err)
	})
}

// storedBytes is the size of the record files in dir.
func storedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			info, err := e.Info()
			require.NoError(t, err)
			n += info.Size()
		}
	}
	return n
}
