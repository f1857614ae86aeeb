package bench

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/persist"
)

// FsyncsPerSave is how many fsync system calls one FileStore.Save makes:
// persist/file.go's writeTemp syncs the temporary file (f.Sync) and, after
// the rename, syncDir syncs the directory (d.Sync). Both are fsync(2) on
// Linux.
const FsyncsPerSave = 2

// SaveReport is the file store's durable save rate.
type SaveReport struct {
	Saves int
	Wall  time.Duration
	P50   time.Duration
	P99   time.Duration
}

// PerSecond returns durable saves per second.
func (r SaveReport) PerSecond() float64 { return float64(r.Saves) / r.Wall.Seconds() }

// OpenReport is the time to open a store of Intents records, one in ten of
// them unresolved, and list the unresolved ones: what an app does at start.
type OpenReport struct {
	Intents    int
	Unresolved int
	// Rebuild is the first OpenDir after the records were written behind
	// the store's back: it lists the directory, reads the unresolved
	// files and writes the index, as after an upgrade or a power cut.
	Rebuild time.Duration
	Open    time.Duration // OpenDir from the index: lock, read the index, stamp the unresolved files
	List    time.Duration // List of the unresolved records
	// Scan is the first operation that needs every record (a Get of an
	// absent key): it waits for what is left of the listing of the
	// directory that OpenDir started in the background.
	Scan time.Duration
	// HeapOpen and HeapScan are the live heap the open store holds, per
	// intent stored, after Open+List (with the listing in the background
	// perhaps under way) and after Scan.
	HeapOpen, HeapScan float64
}

// Millis is Open+List in whole milliseconds, as the summary line prints it.
func (o OpenReport) Millis() int64 { return (o.Open + o.List).Milliseconds() }

// record returns a new intent's record, as the client saves it first.
func record(now time.Time) *persist.Record {
	return &persist.Record{
		Key: uuid.NewString(), Method: http.MethodPost, URL: "http://127.0.0.1/payments",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: paymentBody,
		Fingerprint: strings.Repeat("ab", 32), CreatedAt: now, UpdatedAt: now, State: persist.StateNew,
		Rev: persist.NewRev(),
	}
}

// durableSaves saves n new records one after another into a new store in
// dir, and times them.
func durableSaves(ctx context.Context, dir string, n int) (SaveReport, error) {
	s, err := persist.OpenDir(dir, nil)
	if err != nil {
		return SaveReport{}, err
	}
	defer s.Close()
	lat := make([]time.Duration, n)
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		if err := s.Write(ctx, record(t0), nil); err != nil {
			return SaveReport{}, err
		}
		lat[i] = time.Since(t0)
	}
	r := SaveReport{Saves: n, Wall: time.Since(start)}
	r.P50, r.P99 = percentiles(lat)
	return r, nil
}

// openList seeds dir with n records, one in ten unresolved, and times
// OpenDir and a List of the unresolved ones.
func openList(ctx context.Context, dir string, n int) (OpenReport, error) {
	if err := seed(ctx, dir, n); err != nil {
		return OpenReport{}, err
	}
	// The first open after the seeding rebuilds the index; the timed one
	// opens from it, warm, as an app does at its next start.
	start := time.Now()
	s, err := persist.OpenDir(dir, nil)
	if err != nil {
		return OpenReport{}, err
	}
	rebuild := time.Since(start)
	if err := s.Close(); err != nil {
		return OpenReport{}, err
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	start = time.Now()
	s, err = persist.OpenDir(dir, nil)
	if err != nil {
		return OpenReport{}, err
	}
	defer s.Close()
	opened := time.Now()
	recs, err := s.List(ctx, persist.Filter{Unresolved: true})
	listed := time.Now()
	if err != nil {
		return OpenReport{}, err
	}
	if want := unresolvedOf(n); len(recs) != want {
		return OpenReport{}, fmt.Errorf("listed %d unresolved records, seeded %d", len(recs), want)
	}
	recs = nil
	r := OpenReport{Intents: n, Unresolved: unresolvedOf(n), Rebuild: rebuild, Open: opened.Sub(start), List: listed.Sub(opened)}
	r.HeapOpen = heapPerIntent(&before, n)

	start = time.Now()
	if _, err := s.Get(ctx, "absent"); !errors.Is(err, persist.ErrNotFound) {
		return OpenReport{}, fmt.Errorf("a Get of an absent key returned %v", err)
	}
	r.Scan = time.Since(start)
	r.HeapScan = heapPerIntent(&before, n)
	runtime.KeepAlive(s)
	return r, nil
}

// heapPerIntent returns the live heap grown since before, per intent.
func heapPerIntent(before *runtime.MemStats, n int) float64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return (float64(m.HeapAlloc) - float64(before.HeapAlloc)) / float64(n)
}

// seed fills dir with n record files without syncing them (a durable save
// each would take minutes for 100,000), and removes the store's index. It
// saves the first record through a FileStore and checks that the file
// name it computes for it is the one the store chose, so that a change of
// the store's layout fails here instead of measuring nothing; openList
// then checks that all n are read.
func seed(ctx context.Context, dir string, n int) error {
	s, err := persist.OpenDir(dir, nil)
	if err != nil {
		return err
	}
	first := record(time.Now())
	err = s.Write(ctx, first, nil)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, fileName(first.Key, first.Name))); err != nil {
		return fmt.Errorf("persist's file naming changed, cannot seed the store: %w", err)
	}
	now := time.Now()
	for i := 1; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		r := record(now.Add(time.Duration(i)))
		r.Version = persist.FormatVersion
		if i%10 != 0 {
			r.State = persist.StateSucceeded
			r.Response = &persist.Response{StatusCode: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: paymentBody}
		}
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fileName(r.Key, r.Name)), append(data, '\n'), 0o600); err != nil {
			return err
		}
	}
	// The store's index, written when it closed, holds the first record
	// alone: a tool that puts files in the directory removes it, so that
	// the next OpenDir reads them.
	if err := os.Remove(filepath.Join(dir, "index")); err != nil {
		return fmt.Errorf("persist's index moved, cannot seed the store: %w", err)
	}
	return nil
}

// fileName is persist's name for the file of key and name: "k-", the key
// in lower-case base32hex without padding, ".", the first 8 bytes of the
// SHA-256 of name in the same encoding, then ".json". seed checks it
// against the store, and openList checks that the count of unresolved
// records read is right.
func fileName(key, name string) string {
	enc := base32.HexEncoding.WithPadding(base32.NoPadding)
	tag := sha256.Sum256([]byte(name))
	return "k-" + strings.ToLower(enc.EncodeToString([]byte(key))) + "." + strings.ToLower(enc.EncodeToString(tag[:8])) + ".json"
}

// unresolvedOf is how many of n seeded records are unresolved: the first,
// and every tenth after it.
func unresolvedOf(n int) int { return (n-1)/10 + 1 }
