package persist

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// memory is the Store of NewMemory.
type memory struct {
	opts Options

	mu   sync.Mutex
	recs map[string]*Record
	// names holds the keys of each Name's records. So an action's intents
	// are found without reading every record the store keeps.
	names map[string]map[string]struct{}
}

// NewMemory returns an empty Store that keeps records in memory only.
// They are lost when the process ends. It is meant for tests. It suits
// apps too that accept losing their intents on a restart. They lose with
// them the protection against a second charge after one. opts may be
// nil.
//
// The store copies records on the way in and out. It normalizes them as
// a FileStore does. So a test against it sees what the file store would
// return. Each Write and Delete checks and changes in one step, under the
// store's lock. A Write with WithDeferredSync keeps the caller's headers
// and bodies rather than copying them. The store is safe for concurrent
// use by multiple goroutines.
func NewMemory(opts *Options) Store {
	m := &memory{recs: make(map[string]*Record), names: make(map[string]map[string]struct{})}
	if opts != nil {
		m.opts = *opts
	}
	return m
}

// Write stores a copy of rec if the stored records allow it (see Store).
func (m *memory) Write(ctx context.Context, rec, old *Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkWrite(rec, old); err != nil {
		return err
	}
	var r *Record
	if DeferredSync(ctx) {
		r = prepareShared(rec, m.opts)
	} else {
		r = prepare(rec, m.opts)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var named []*Record
	if old == nil && r.Name != "" {
		for k := range m.names[r.Name] {
			named = append(named, m.recs[k])
		}
	}
	cur := m.recs[r.Key]
	if err := writable(r, old, cur, named); err != nil {
		return err
	}
	m.recs[r.Key] = r
	// The index of names: a record keeps its Name, so only a new key adds
	// to it.
	if cur == nil && r.Name != "" {
		if m.names[r.Name] == nil {
			m.names[r.Name] = make(map[string]struct{})
		}
		m.names[r.Name][r.Key] = struct{}{}
	}
	return nil
}

// Delete removes the record stored with old.Key if it is old's version.
func (m *memory) Delete(ctx context.Context, old *Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkDelete(old); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.recs[old.Key]
	if !ok {
		return nil
	}
	if err := deletable(old, cur); err != nil {
		return err
	}
	delete(m.recs, old.Key)
	// Its entry in the index of names goes in constant time. So pruning
	// many records of one Name costs each of them once.
	delete(m.names[cur.Name], old.Key)
	if len(m.names[cur.Name]) == 0 {
		delete(m.names, cur.Name)
	}
	return nil
}

// Get returns a copy of the record for key, or an error matching
// ErrNotFound.
func (m *memory) Get(ctx context.Context, key string) (*Record, error) {
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

// List returns copies of the records selected by f. They come oldest
// CreatedAt first, and by Key among equals. A memory store never holds
// unreadable records. So its error is only ever ctx's.
func (m *memory) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	var out []*Record
	keys := maps.Keys(m.recs)
	if f.Name != "" {
		keys = maps.Keys(m.names[f.Name])
	}
	for k := range keys {
		if r := m.recs[k]; f.match(r) {
			out = append(out, r.Clone())
		}
	}
	m.mu.Unlock()
	sortRecords(out)
	return out, nil
}
