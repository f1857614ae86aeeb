package persist

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist/internal/fsys"
)

// formatDir holds record format 1 as files: one record of each state the
// client writes, and an index of the unresolved ones. The format is
// frozen. A change to it needs a new FormatVersion (and, for the index, a
// new indexVersion), never new bytes here.
const formatDir = "testdata/format1"

// formatRecords returns the records the golden files hold, by file
// stem. Between them they set every field of a Record.
func formatRecords() map[string]*Record {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 250_000_000, time.UTC)
	base := func(state State, seq uint64) *Record {
		key := "6f1c2a4e-9b7d-4e3a-8c55-00000000000" + string(rune('0'+seq))
		return &Record{
			Version: 1, Rev: "RVQ2PXKZL4UYH3CMWJ7N5TBEGA", Key: key, Name: "checkout:cart-42",
			Method: http.MethodPost, URL: "https://api.example.com/v1/payments",
			Header:      http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}},
			Body:        []byte(`{"amount":1999,"currency":"EUR"}`),
			Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			KeyHeader:   key, Seq: seq, CreatedAt: t0, UpdatedAt: t0.Add(time.Second),
			State: state, Attempts: 1, Holder: "client-8d3h",
			Clocks: &Clocks{
				ArmBoot: "boot-1", Armed: 90 * time.Second, WriteBoot: "boot-1", Written: 91 * time.Second,
				ArmMark: t0, Mark: t0.Add(time.Second),
				SendWall: t0.Add(30 * time.Second), SendBoot: "boot-1", SendBy: 120 * time.Second,
			},
		}
	}
	answer := func(r *Record, status int, body string) *Record {
		r.Response = &Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
		return r
	}
	newRec := base(StateNew, 1)
	newRec.Attempts, newRec.HandedOut = 0, true
	notSent := base(StateNotSent, 2)
	notSent.Attempts = 0
	pending := base(StatePending, 3)
	pending.Redirected = true
	expired := base(StateExpired, 4)
	expired.Attempts, expired.Header["Idempotency-Key"] = 3, nil
	succeeded := answer(base(StateSucceeded, 5), 201, `{"id":"pay_3Nf82kLm","status":"succeeded"}`)
	succeeded.Response.Replayed = true
	failed := answer(base(StateFailed, 6), 402, `{"error":"card_declined"}`)
	failed.KeyHeader = `"` + failed.Key + `"`
	rejected := answer(base(StateRejected, 7), 422, `{"error":"key_reused"}`)
	rejected.Response.Oversized, rejected.Response.Body = true, nil
	void := base(StateVoid, 8)
	void.Tombstone, void.Header, void.Body, void.Clocks, void.Name = true, nil, nil, nil, ""
	return map[string]*Record{
		"new": newRec, "not_sent": notSent, "pending": pending, "expired": expired,
		"succeeded": succeeded, "failed": failed, "rejected": rejected, "void": void,
	}
}

// formatIndex returns the files of the golden index: the unresolved
// golden records, with made-up stamps, in name order.
func formatIndex(recs map[string]*Record) []entry {
	var files []entry
	for _, r := range recs {
		if !r.State.Resolved() {
			files = append(files, entry{name: fileName(r.Key, r.Name), rec: r})
		}
	}
	slices.SortFunc(files, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	for i := range files {
		files[i].st = fsys.Stamp{Ino: uint64(1000 + i), Size: 900, Mod: 1772366400_000_000_000, Change: 1772366401_000_000_000}
	}
	// A damaged file the index lists without a record.
	files = append(files, entry{name: fileName("damaged", "checkout:cart-42"), mode: fs.ModeNamedPipe})
	return files
}

// formatKnown returns the set of record files the golden index was built
// from: one file per golden record.
func formatKnown(recs map[string]*Record) nameSet {
	var known nameSet
	for _, r := range recs {
		known.add(fileName(r.Key, r.Name))
	}
	return known
}

// TestFormat: record format 1 is frozen. Its golden files read as the
// records they hold, and those records write back to the same bytes.
func TestFormat(t *testing.T) {
	t.Parallel()
	recs := formatRecords()
	t.Run("each state's golden record reads back and writes its bytes", func(t *testing.T) {
		t.Parallel()
		for stem, want := range recs {
			data, err := os.ReadFile(filepath.Join(formatDir, stem+".json"))
			require.NoError(t, err)
			got, err := decodeRecord(data)
			require.NoError(t, err, stem)
			assert.Equal(t, want, got, stem)
			enc, err := encodeRecord(want)
			require.NoError(t, err)
			assert.Equal(t, string(data), string(enc), "%s: writing the record gives other bytes", stem)
		}
	})
	t.Run("the golden index reads back and writes its bytes", func(t *testing.T) {
		t.Parallel()
		data, err := os.ReadFile(filepath.Join(formatDir, indexFile))
		require.NoError(t, err)
		want := formatIndex(recs)
		c, known, files, err := decodeIndexFiles(data)
		require.NoError(t, err)
		for _, f := range files {
			if f.rec != nil {
				c.record(f.rec)
			}
		}
		require.NoError(t, c.err)
		assert.Empty(t, c.s, "bytes left over")
		assert.Equal(t, formatKnown(recs), known)
		assert.Equal(t, want, files)
		assert.Equal(t, data, encodeIndex(formatKnown(recs), want), "writing the index gives other bytes")
	})
	t.Run("a record of a newer format version is refused", func(t *testing.T) {
		t.Parallel()
		data, err := os.ReadFile(filepath.Join(formatDir, "pending.json"))
		require.NoError(t, err)
		newer := strings.Replace(string(data), `{"version":1,`, `{"version":2,`, 1)
		require.NotEqual(t, string(data), newer)
		_, err = decodeRecord([]byte(newer))
		assert.ErrorIs(t, err, ErrNewerVersion)
	})
}
