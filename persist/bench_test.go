package persist

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The benchmarks measure the file store, and Memory beside it. Run them
// with
//
//	go test ./persist -run '^$' -bench . -benchtime 200x
//	go test ./persist -run '^$' -bench OpenList -args -bench100k
//
// The comparison with a store on go.etcd.io/bbolt, which chose the file
// store as the default, is the nested module persist/boltbench: bbolt stays
// out of idem's go.mod.
var bench100k = flag.Bool("bench100k", false, "also benchmark open+list of 100,000 intents")

// benchRecord is a realistic payment intent: about 1 KB of JSON on disk,
// with a response once resolved.
func benchRecord(i int, resolved bool) *Record {
	key := fmt.Sprintf("6f1c2a4e-9b7d-4e3a-8c55-%012d", i)
	created := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second)
	r := &Record{
		Version: FormatVersion, Key: key, Rev: NewRev(), Seq: uint64(i + 1), Name: fmt.Sprintf("checkout:cart-%d", i%97),
		Method: http.MethodPost, URL: "https://api.example.com/v1/payments",
		Header: http.Header{
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {key},
			"User-Agent":      {"idem/0.1 (ios 19.2)"},
		},
		Body:        []byte(`{"amount":1999,"currency":"EUR","customer":"cus_8f2k1","description":"Order 42, 3 items","source":"tok_visa_4242","metadata":{"cart":"cart-42","app":"shop/5.1"}}`),
		Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		CreatedAt:   created, UpdatedAt: created, State: StatePending, Attempts: 1,
	}
	if resolved {
		r.State, r.Attempts, r.UpdatedAt = StateSucceeded, 2, created.Add(3*time.Second)
		r.Response = &Response{
			StatusCode: 201,
			Header:     http.Header{"Content-Type": {"application/json"}, "Request-Id": {"req_8d3h2k1l"}},
			Body:       []byte(`{"id":"pay_3Nf82kLm","status":"succeeded","amount":1999,"currency":"EUR","created":1772323200}`),
		}
	}
	return r
}

// fsyncCounter is a store that counts its fsyncs.
type fsyncCounter interface{ fsyncs() int64 }

func (s *FileStore) fsyncs() int64 { return s.syncs.Load() }

func BenchmarkSave(b *testing.B) {
	engines := []struct {
		name string
		open func(b *testing.B) Store
	}{
		{"file-durable", func(b *testing.B) Store {
			s, err := OpenDir(filepath.Join(b.TempDir(), "store"), nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
		{"memory", func(*testing.B) Store { return NewMemory(nil) }},
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			s := e.open(b)
			ctx := context.Background()
			i := 0
			for b.Loop() {
				if err := s.Write(ctx, benchRecord(i, i%2 == 1), nil); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if c, ok := s.(fsyncCounter); ok {
				b.ReportMetric(float64(c.fsyncs())/float64(i), "fsyncs/op")
			}
		})
	}
}

// BenchmarkOpenList opens a store of n intents, one in ten unresolved, and
// lists the unresolved ones: what an app does at start. The files are in the
// page cache, as they are after the first start of a process; a cold start
// from flash reads them from disk once.
func BenchmarkOpenList(b *testing.B) {
	sizes := []int{10_000}
	if *bench100k {
		sizes = append(sizes, 100_000)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("file-%d", n), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "store")
			fillDir(b, dir, n)
			// Not timed: the first open scans, and writes the index
			// that every open after it starts from.
			s, err := OpenDir(dir, nil)
			if err != nil {
				b.Fatal(err)
			}
			s.Close()
			// CPU time counts the background listing too, which the
			// wall time leaves out.
			cpu0, opens := cpuTime(), 0
			for b.Loop() {
				opens++
				s, err := OpenDir(dir, nil)
				if err != nil {
					b.Fatal(err)
				}
				listUnresolved(b, s, n)
				// Not timed: Close waits for the listing that OpenDir
				// started in the background, which an app at start does
				// not wait for.
				b.StopTimer()
				s.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/1e6/float64(opens), "cpu-ms/op")
		})
	}
}

func listUnresolved(b *testing.B, s Store, n int) {
	recs, err := s.List(context.Background(), Filter{Unresolved: true})
	if err != nil {
		b.Fatal(err)
	}
	if len(recs) != n/10 {
		b.Fatalf("listed %d unresolved intents, want %d", len(recs), n/10)
	}
}

// fillDir writes n record files as the file store would, without syncing
// each: only the reading is measured.
func fillDir(b *testing.B, dir string, n int) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	for i := range n {
		r := benchRecord(i, i%10 != 0)
		data, err := encodeRecord(r)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, fileName(r.Key, r.Name)), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConcurrentSaves is a command-line client saving many intents at
// once: 32 goroutines, each saving new intents, every Save durable. It
// reports durable saves per second and fsyncs per save.
func BenchmarkConcurrentSaves(b *testing.B) {
	const workers = 32
	s, err := OpenDir(filepath.Join(b.TempDir(), "store"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	recs := make([]*Record, b.N)
	for i := range recs {
		recs[i] = benchRecord(i, false)
	}
	next := make(chan *Record, b.N)
	for _, r := range recs {
		next <- r
	}
	close(next)
	b.ResetTimer()
	start := time.Now()
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for r := range next {
				if err := s.Write(ctx, r, nil); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "saves/s")
	b.ReportMetric(float64(s.syncs.Load())/float64(b.N), "fsyncs/save")
}

// BenchmarkFirstSave opens a store of n intents from its index, one in
// ten unresolved, and times its first Save: the save of a new intent, as
// an app makes when the user pays some time after start
// ("after-start"), or at once ("at-open"). Run it with
//
//	go test ./persist -run '^$' -bench FirstSave -benchtime 20x -args -bench100k
func BenchmarkFirstSave(b *testing.B) {
	sizes := []int{10_000}
	if *bench100k {
		sizes = append(sizes, 100_000)
	}
	for _, n := range sizes {
		dir := filepath.Join(b.TempDir(), "store")
		fillDir(b, dir, n)
		s, err := OpenDir(dir, nil) // scans, and writes the index
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
		for _, at := range []string{"after-start", "at-open"} {
			b.Run(fmt.Sprintf("%s-%d", at, n), func(b *testing.B) {
				ctx := context.Background()
				i := n
				for b.Loop() {
					b.StopTimer()
					s, err := OpenDir(dir, nil)
					if err != nil {
						b.Fatal(err)
					}
					if !s.fromIndex {
						b.Fatal("not opened from the index")
					}
					if at == "after-start" {
						waitOpened(s)
					}
					r := benchRecord(i, false)
					i++
					b.StartTimer()
					if err := s.Write(ctx, r, nil); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := s.Delete(ctx, r); err != nil {
						b.Fatal(err)
					}
					s.Close()
					b.StartTimer()
				}
			})
		}
	}
}

// waitOpened waits for the listing OpenDir started in the background.
func waitOpened(s *FileStore) {
	s.mu.Lock()
	ch := s.listing
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
}
