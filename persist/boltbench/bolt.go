package boltbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/persist"
	bolt "go.etcd.io/bbolt"
)

// boltStore is the smallest persist.Store on bbolt as safe as the file
// store. It lists unresolved intents as quickly too. Each Write is one
// durable transaction. bbolt syncs the data, then the meta page. The same
// transaction keeps an index bucket of the unresolved keys. It is for the
// comparison only, not a store to use. Its Write checks the record of
// rec.Key. It does not check the Seq of the other records of rec.Name.
// The comparison writes new keys, so it does not need that.
type boltStore struct {
	db *bolt.DB
}

var (
	boltBucket = []byte("intents")
	boltOpen   = []byte("unresolved")
)

func openBolt(path string) (*boltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(boltBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(boltOpen)
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &boltStore{db: db}, nil
}

func (s *boltStore) Close() error { return s.db.Close() }

func (s *boltStore) Write(ctx context.Context, rec, old *persist.Record) error {
	if rec == nil {
		return errors.New("boltbench: cannot write a nil record")
	}
	if err := rec.Validate(); err != nil {
		return err
	}
	if rec.Rev == "" || old != nil && (old.Key != rec.Key || old.Rev == rec.Rev) {
		return fmt.Errorf("boltbench: record %s needs a new version (Rev) over the one it replaces", rec.Key)
	}
	r := rec.Clone()
	r.Version = persist.FormatVersion
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		cur, err := decode(tx.Bucket(boltBucket).Get([]byte(r.Key)))
		if err != nil {
			return err
		}
		if old == nil && cur != nil || old != nil && (cur == nil || cur.Rev != old.Rev) {
			return &persist.ConflictError{Key: r.Key, Current: cur}
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

// writeAll stores new records in one transaction, without the checks of
// Write. It fills a store for the benchmarks of reading.
func (s *boltStore) writeAll(recs []*persist.Record) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, r := range recs {
			r = r.Clone()
			r.Version = persist.FormatVersion
			data, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := tx.Bucket(boltBucket).Put([]byte(r.Key), data); err != nil {
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
}

func (s *boltStore) Get(ctx context.Context, key string) (*persist.Record, error) {
	var r *persist.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		r, err = decode(tx.Bucket(boltBucket).Get([]byte(key)))
		if err == nil && r == nil {
			err = persist.ErrNotFound
		}
		return err
	})
	return r, err
}

func (s *boltStore) List(ctx context.Context, f persist.Filter) ([]*persist.Record, error) {
	var out []*persist.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		all := tx.Bucket(boltBucket)
		add := func(v []byte) error {
			r, err := decode(v)
			if err != nil {
				return err
			}
			if (f.Name == "" || r.Name == f.Name) && !(f.Unresolved && r.State.Resolved()) {
				out = append(out, r)
			}
			return nil
		}
		if f.Unresolved {
			return tx.Bucket(boltOpen).ForEach(func(k, _ []byte) error { return add(all.Get(k)) })
		}
		return all.ForEach(func(_, v []byte) error { return add(v) })
	})
	slices.SortFunc(out, func(a, b *persist.Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out, err
}

func (s *boltStore) Delete(ctx context.Context, old *persist.Record) error {
	if old == nil || old.Rev == "" {
		return errors.New("boltbench: Delete needs the version to delete")
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		cur, err := decode(tx.Bucket(boltBucket).Get([]byte(old.Key)))
		if err != nil || cur == nil {
			return err
		}
		if cur.Rev != old.Rev {
			return &persist.ConflictError{Key: old.Key, Current: cur}
		}
		if err := tx.Bucket(boltOpen).Delete([]byte(old.Key)); err != nil {
			return err
		}
		return tx.Bucket(boltBucket).Delete([]byte(old.Key))
	})
}

// decode reads a stored record. nil data (no record) gives nil. bbolt's
// values live only as long as their transaction. So the record is
// decoded from a copy.
func decode(data []byte) (*persist.Record, error) {
	if data == nil {
		return nil, nil
	}
	var r persist.Record
	if err := json.Unmarshal(bytes.Clone(data), &r); err != nil {
		return nil, &persist.CorruptError{Err: err}
	}
	return &r, nil
}
