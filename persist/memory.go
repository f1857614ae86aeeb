package persist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Memory is a Store that keeps records in memory only: they are lost when
// the process ends. It is meant for tests, and for apps that accept losing
// their intents on a restart (and with them the protection against a second
// charge after one).
//
// Memory copies records on the way in and out, and normalizes them as a
// FileStore does, so that a test against Memory sees what the file store
// would return. A Memory is safe for concurrent use by multiple goroutines.
type Memory struct {
	opts Options

	mu   sync.Mutex
	recs map[string]*Record
}

// NewMemory returns an empty Memory store. opts may be nil.
func NewMemory(opts *Options) *Memory {
	m := &Memory{recs: make(map[string]*Record)}
	if opts != nil {
		m.opts = *opts
	}
	return m
}

// Save stores a copy of rec, replacing any record with the same Key.
func (m *Memory) Save(ctx context.Context, rec *Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r, err := prepare(rec, m.opts)
	if err != nil {
		return err
	}
	m.put(r)
	return nil
}

// saveShared is Save for the package's saveShared: it keeps rec's headers and bodies
// rather than copying them.
func (m *Memory) saveShared(ctx context.Context, rec *Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r, err := prepareShared(rec, m.opts)
	if err != nil {
		return err
	}
	m.put(r)
	return nil
}

func (m *Memory) put(r *Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[r.Key] = r
}

// Claim implements claimer: the check and the save happen under the
// store's lock.
func (m *Memory) Claim(ctx context.Context, rec *Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r, err := prepare(rec, m.opts)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var same []*Record
	for _, o := range m.recs {
		if o.Key == r.Key || r.Name != "" && o.Name == r.Name {
			same = append(same, o)
		}
	}
	if err := claimable(same, r); err != nil {
		var ce *ClaimError
		if errors.As(err, &ce) {
			ce.Latest = ce.Latest.Clone()
		}
		return err
	}
	m.recs[r.Key] = r
	return nil
}

// SaveIf implements swapper: the check and the save happen under the
// store's lock.
func (m *Memory) SaveIf(ctx context.Context, rec, old *Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r, err := prepare(rec, m.opts)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unchangedLocked(old); err != nil {
		return err
	}
	m.recs[r.Key] = r
	return nil
}

// DeleteIf implements swapper: the check and the delete happen under the
// store's lock.
func (m *Memory) DeleteIf(ctx context.Context, old *Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[old.Key]; !ok {
		return nil
	}
	if err := m.unchangedLocked(old); err != nil {
		return err
	}
	delete(m.recs, old.Key)
	return nil
}

func (m *Memory) unchangedLocked(old *Record) error {
	cur, ok := m.recs[old.Key]
	if !ok {
		return &ChangedError{Key: old.Key}
	}
	if !sameVersion(cur, old) {
		return &ChangedError{Key: old.Key, Current: cur.Clone()}
	}
	return nil
}

// Get returns a copy of the record for key, or an error matching
// ErrNotFound.
func (m *Memory) Get(ctx context.Context, key string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[key]
	if !ok {
		return nil, fmt.Errorf("%w: key %q", ErrNotFound, key)
	}
	return r.Clone(), nil
}

// List returns copies of the records selected by f, oldest CreatedAt first
// and by Key among equals. Memory never holds unreadable records, so its
// error is only ever ctx's.
func (m *Memory) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	var out []*Record
	for _, r := range m.recs {
		if f.Match(r) {
			out = append(out, r.Clone())
		}
	}
	m.mu.Unlock()
	sortRecords(out)
	return out, nil
}

// Delete removes the record for key, if there is one.
func (m *Memory) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, key)
	return nil
}

// Prune implements pruner: see the function Prune.
func (m *Memory) Prune(ctx context.Context, before time.Time) (int, error) {
	return m.PruneFunc(ctx, func(r *Record) bool { return prunable(r, before) })
}

// PruneFunc implements funcPruner: see the function PruneFunc.
func (m *Memory) PruneFunc(ctx context.Context, drop func(*Record) bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, r := range m.recs {
		if r.State.Resolved() && drop(r) {
			delete(m.recs, k)
			n++
		}
	}
	return n, nil
}
