package boltbench

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/persist"
)

var bench100k = flag.Bool("bench100k", false, "also benchmark open+list of 100,000 intents")

// benchRecord is a realistic payment intent: about 1 KB of JSON on disk,
// with a response once resolved.
func benchRecord(i int, resolved bool) *persist.Record {
	key := fmt.Sprintf("6f1c2a4e-9b7d-4e3a-8c55-%012d", i)
	created := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second)
	r := &persist.Record{
		Key: key, Rev: persist.NewRev(), Seq: uint64(i + 1), Name: fmt.Sprintf("checkout:cart-%d", i%97),
		Method: http.MethodPost, URL: "https://api.example.com/v1/payments",
		Header: http.Header{
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {key},
			"User-Agent":      {"idem/0.1 (ios 19.2)"},
		},
		Body:        []byte(`{"amount":1999,"currency":"EUR","customer":"cus_8f2k1","description":"Order 42, 3 items","source":"tok_visa_4242","metadata":{"cart":"cart-42","app":"shop/5.1"}}`),
		Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		CreatedAt:   created, UpdatedAt: created, State: persist.StatePending, Attempts: 1,
	}
	if resolved {
		r.State, r.Attempts, r.UpdatedAt = persist.StateSucceeded, 2, created.Add(3*time.Second)
		r.Response = &persist.Response{
			StatusCode: 201,
			Header:     http.Header{"Content-Type": {"application/json"}, "Request-Id": {"req_8d3h2k1l"}},
			Body:       []byte(`{"id":"pay_3Nf82kLm","status":"succeeded","amount":1999,"currency":"EUR","created":1772323200}`),
		}
	}
	return r
}

// engine opens one kind of store at path, which it creates if need be.
type engine struct {
	name string
	open func(path string) (persist.Store, func() error, error)
}

var engines = []engine{
	{"file", func(path string) (persist.Store, func() error, error) {
		s, err := persist.OpenDir(path, nil)
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	}},
	{"bbolt", func(path string) (persist.Store, func() error, error) {
		s, err := openBolt(path)
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	}},
}

func open(b *testing.B, e engine, path string) (persist.Store, func() error) {
	s, closeStore, err := e.open(path)
	if err != nil {
		b.Fatal(err)
	}
	return s, closeStore
}

// BenchmarkSave times a durable Write of a new intent.
func BenchmarkSave(b *testing.B) {
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			s, closeStore := open(b, e, filepath.Join(b.TempDir(), "store"))
			defer closeStore()
			ctx := context.Background()
			i := 0
			for b.Loop() {
				if err := s.Write(ctx, benchRecord(i, i%2 == 1), nil); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkOpenList opens a store of n intents, one in ten unresolved, and
// lists the unresolved ones: what an app does at start. The data is in the
// page cache, as it is after the first start of a process.
func BenchmarkOpenList(b *testing.B) {
	sizes := []int{10_000}
	if *bench100k {
		sizes = append(sizes, 100_000)
	}
	for _, n := range sizes {
		for _, e := range engines {
			b.Run(fmt.Sprintf("%s-%d", e.name, n), func(b *testing.B) {
				path := filepath.Join(b.TempDir(), "store")
				fill(b, e, path, n)
				for b.Loop() {
					s, closeStore := open(b, e, path)
					recs, err := s.List(context.Background(), persist.Filter{Unresolved: true})
					if err != nil {
						b.Fatal(err)
					}
					if len(recs) != n/10 {
						b.Fatalf("listed %d unresolved intents, want %d", len(recs), n/10)
					}
					// Not timed: the file store's Close waits for the
					// listing that OpenDir started in the background,
					// which an app at start does not wait for.
					b.StopTimer()
					if err := closeStore(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}

// fill writes n intents, one in ten unresolved. Only the reading is
// measured, so the writes are made the quickest way each store allows:
// bbolt's in one transaction, the file store's from 32 goroutines, whose
// syncs it shares.
func fill(b *testing.B, e engine, path string, n int) {
	s, closeStore := open(b, e, path)
	defer func() {
		if err := closeStore(); err != nil {
			b.Fatal(err)
		}
	}()
	recs := make([]*persist.Record, n)
	for i := range recs {
		recs[i] = benchRecord(i, i%10 != 0)
	}
	if bs, ok := s.(*boltStore); ok {
		if err := bs.writeAll(recs); err != nil {
			b.Fatal(err)
		}
		return
	}
	// A new intent must come after the stored ones of its action (Seq):
	// each goroutine writes the actions of its own, in order.
	const workers = 32
	ctx := context.Background()
	var g errgroup
	for w := range workers {
		g.Go(func() error {
			for i, r := range recs {
				if i%97%workers != w {
					continue
				}
				if err := s.Write(ctx, r, nil); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// errgroup runs goroutines and keeps the first error one returns.
type errgroup struct {
	wg   sync.WaitGroup
	once sync.Once
	err  error
}

func (g *errgroup) Go(f func() error) {
	g.wg.Go(func() {
		if err := f(); err != nil {
			g.once.Do(func() { g.err = err })
		}
	})
}

func (g *errgroup) Wait() error {
	g.wg.Wait()
	return g.err
}
