package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The benchmarks compare the file store with Memory and with a minimal
// store on go.etcd.io/bbolt (boltStore below), to decide which engine is the
// default. Run them with
//
//	go test ./persist -run '^$' -bench . -benchtime 200x
//	go test ./persist -run '^$' -bench OpenList -args -bench100k
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
		{"bbolt", func(b *testing.B) Store { return openBolt(b, filepath.Join(b.TempDir(), "idem.db")) }},
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
			for b.Loop() {
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
		})
		b.Run(fmt.Sprintf("bbolt-%d", n), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "idem.db")
			fillBolt(b, path, n)
			for b.Loop() {
				s := openBolt(b, path)
				listUnresolved(b, s, n)
				s.db.Close()
			}
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
		if err := os.WriteFile(filepath.Join(dir, fileName(r.Key, r.Name, r.State.Resolved())), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

func fillBolt(b *testing.B, path string, n int) {
	s := openBolt(b, path)
	defer s.db.Close()
	err := s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		for i := range n {
			r := benchRecord(i, i%10 != 0)
			data, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := bk.Put([]byte(r.Key), data); err != nil {
				return err
			}
			if !r.State.Resolved() {
				if err := tx.Bucket(boltOpen).Put([]byte(r.Key), nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// boltStore is the smallest Store on bbolt that is as safe and as quick to
// list unresolved intents as the file store: one durable transaction per
// Save (bbolt syncs the data, then the meta page), with an index bucket of
// the unresolved keys kept in the same transaction. It is for the
// comparison only, not a Store of this package.
type boltStore struct {
	db   *bolt.DB
	opts Options
}

var (
	boltBucket = []byte("intents")
	boltOpen   = []byte("unresolved")
)

func openBolt(b *testing.B, path string) *boltStore {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(boltBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(boltOpen)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return &boltStore{db: db}
}

// Write checks only the record of rec.Key, not the records of its Name:
// enough for the comparison, which writes new keys.
func (s *boltStore) Write(ctx context.Context, rec, old *Record) error {
	if err := checkWrite(rec, old); err != nil {
		return err
	}
	r := prepare(rec, s.opts)
	data, err := encodeRecord(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		var cur *Record
		if v := tx.Bucket(boltBucket).Get([]byte(r.Key)); v != nil {
			if cur, err = decodeRecord(bytes.Clone(v)); err != nil {
				return err
			}
		}
		if err := writable(r, old, cur, nil); err != nil {
			return err
		}
		if err := tx.Bucket(boltBucket).Put([]byte(r.Key), data); err != nil {
			return err
		}
		if r.State.Resolved() {
			return tx.Bucket(boltOpen).Delete([]byte(r.Key))
		}
		return tx.Bucket(boltOpen).Put([]byte(r.Key), nil)
	})
}

func (s *boltStore) Get(ctx context.Context, key string) (*Record, error) {
	var r *Record
	err := s.db.View(func(tx *bolt.Tx) error {
		data := tx.Bucket(boltBucket).Get([]byte(key))
		if data == nil {
			return ErrNotFound
		}
		var err error
		r, err = decodeRecord(data)
		return err
	})
	return r, err
}

func (s *boltStore) List(ctx context.Context, f Filter) ([]*Record, error) {
	var out []*Record
	err := s.db.View(func(tx *bolt.Tx) error {
		all := tx.Bucket(boltBucket)
		add := func(v []byte) error {
			r, err := decodeRecord(bytes.Clone(v))
			if err != nil {
				return err
			}
			if f.match(r) {
				out = append(out, r)
			}
			return nil
		}
		if f.Unresolved {
			return tx.Bucket(boltOpen).ForEach(func(k, _ []byte) error { return add(all.Get(k)) })
		}
		return all.ForEach(func(_, v []byte) error { return add(v) })
	})
	sortRecords(out)
	return out, err
}

func (s *boltStore) Delete(ctx context.Context, old *Record) error {
	if err := checkDelete(old); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		v := tx.Bucket(boltBucket).Get([]byte(old.Key))
		if v == nil {
			return nil
		}
		cur, err := decodeRecord(bytes.Clone(v))
		if err != nil {
			return err
		}
		if err := deletable(old, cur); err != nil {
			return err
		}
		if err := tx.Bucket(boltOpen).Delete([]byte(old.Key)); err != nil {
			return err
		}
		return tx.Bucket(boltBucket).Delete([]byte(old.Key))
	})
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
