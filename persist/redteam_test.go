package persist_test

// Red-team findings against the device store. Each test fails while the
// weakness it names is in the code. Every attack goes through the public
// API of package persist and a real directory in t.TempDir().

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// TestWriteReadsBackAsWrittenResponseHeaderNotUTF8 breaks the Store
// contract ("A record reads back as written") and the file-layout promise
// that bytes JSON would change are refused with an error ("So Write
// refuses a Key, a Name or a request header that is not UTF-8").
//
// Path to the failure: Validate checks only the request's header for
// UTF-8, not the stored Response's header. A server's answer may carry
// obs-text bytes (a Latin-1 filename, a bank's reference) that net/http
// accepts. Write of the resolved intent succeeds, but json.Marshal turns
// each byte that is not UTF-8 into U+FFFD. Get returns another header
// than the server sent and than the memory store returns, silently.
func TestWriteReadsBackAsWrittenResponseHeaderNotUTF8(t *testing.T) {
	ctx := context.Background()
	s, err := persist.OpenDir(rtDir(t), nil)
	require.NoError(t, err)
	defer s.Close()
	r := rtResolved("k-latin1", rtT0)
	r.Response.Header.Set("X-Payment-Ref", "caf\xe9-42")
	err = persisttest.Put(ctx, s, r)
	if err != nil {
		return // refused with an error: the promise holds
	}
	got, err := s.Get(ctx, "k-latin1")
	require.NoError(t, err)
	if g := got.Response.Header.Get("X-Payment-Ref"); g != "caf\xe9-42" {
		t.Fatalf("the stored answer's header reads back as %q, written as %q, and Write returned nil", g, "caf\xe9-42")
	}
}
