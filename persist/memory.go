package persist

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// memory is the Store of NewMemory.
type memory struct {
	opts Options

	mu   sync.Mutex
	recs map[string]*Record
	// names holds the keys of each Name's records, so that an action's
	// intents are found without reading every record the store keeps.
	names map[string][]string
}

// NewMemory returns an empty Store that keeps records in memory only: they
// are lost when the process ends. It is meant for tests, and for apps that
// accept losing their intents on a restart (and with them the protection
// against a second charge after one). opts may be nil.
//
// The store copies records on the way in and out, and normalizes them as a
// FileStore does, so that a test against it sees what the file store would
// return. Like a FileStore, it claims, changes and deletes records with
// Claim, SaveIf and DeleteIf, and prunes them, each in one step under its
// lock. It is safe for concurrent use by multiple goroutines.
//
// A wrapper of it that embeds the Store (struct{ persist.Store }) has only
// Save, Get, List and Delete: the functions Claim, SaveIf and DeleteIf
// then work through a List or a Get and a Save, made one step among the
// calls of this process by one lock of the package, which serialises them
// with every other such store's. Give such a wrapper the methods listed on
// Store, each calling the function of the same name on the store it wraps,
// and it claims under the memory store's own lock.
func NewMemory(opts *Options) Store {
	m := &memory{recs: make(map[string]*Record), names: make(map[string][]string)}
	if opts != nil {
		m.opts = *opts
	}
	return m
}

// Save stores a copy of rec, replacing any record with the same Key.
func (m *memory) Save(ctx context.Context, rec *Record) error {
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
func (m *memory) saveShared(ctx context.Context, rec *Record) error {
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

func (m *memory) put(r *Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.setLocked(r)
}

// setLocked stores r in place of any record with its Key, and keeps the
// index of names in step.
func (m *memory) setLocked(r *Record) {
	old, had := m.recs[r.Key]
	m.recs[r.Key] = r
	if had && old.Name == r.Name {
		return
	}
	if had {
		m.unnameLocked(old)
	}
	if r.Name != "" {
		m.names[r.Name] = append(m.names[r.Name], r.Key)
	}
}

// removeLocked removes the record for key and its entry in the index of
// names.
func (m *memory) removeLocked(key string) {
	if old, ok := m.recs[key]; ok {
		delete(m.recs, key)
		m.unnameLocked(old)
	}
}

func (m *memory) unnameLocked(r *Record) {
	if r.Name == "" {
		return
	}
	keys := m.names[r.Name]
	for i, k := range keys {
		if k == r.Key {
			keys = append(keys[:i], keys[i+1:]...)
			break
		}
	}
	if len(keys) == 0 {
		delete(m.names, r.Name)
	} else {
		m.names[r.Name] = keys
	}
}

// namedLocked returns the records named name.
func (m *memory) namedLocked(name string) []*Record {
	keys := m.names[name]
	out := make([]*Record, 0, len(keys))
	for _, k := range keys {
		out = append(out, m.recs[k])
	}
	return out
}

// claim implements claimer: the check and the save happen under the
// store's lock.
func (m *memory) claim(ctx context.Context, rec *Record) error {
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
	if r.Name != "" {
		same = m.namedLocked(r.Name)
	}
	if o, ok := m.recs[r.Key]; ok && (r.Name == "" || o.Name != r.Name) {
		same = append(same, o)
	}
	if err := claimable(same, r); err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) {
			ce.Current = ce.Current.Clone()
		}
		return err
	}
	m.setLocked(r)
	return nil
}

// saveIf implements swapper: the check and the save happen under the
// store's lock.
func (m *memory) saveIf(ctx context.Context, rec, old *Record) error {
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
	m.setLocked(r)
	return nil
}

// deleteIf implements swapper: the check and the delete happen under the
// store's lock.
func (m *memory) deleteIf(ctx context.Context, old *Record) error {
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
	m.removeLocked(old.Key)
	return nil
}

func (m *memory) unchangedLocked(old *Record) error {
	cur, ok := m.recs[old.Key]
	if !ok {
		return &ConflictError{Key: old.Key}
	}
	if !sameVersion(cur, old) {
		return &ConflictError{Key: old.Key, Current: cur.Clone()}
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

// List returns copies of the records selected by f, oldest CreatedAt first
// and by Key among equals. A memory store never holds unreadable records,
// so its error is only ever ctx's.
func (m *memory) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	var out []*Record
	if f.Name != "" {
		for _, k := range m.names[f.Name] {
			if r := m.recs[k]; f.match(r) {
				out = append(out, r.Clone())
			}
		}
	} else {
		for _, r := range m.recs {
			if f.match(r) {
				out = append(out, r.Clone())
			}
		}
	}
	m.mu.Unlock()
	sortRecords(out)
	return out, nil
}

// Delete removes the record for key, if there is one.
func (m *memory) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.removeLocked(key)
	return nil
}

// pruneFunc implements funcPruner: see PruneFunc.
func (m *memory) pruneFunc(ctx context.Context, drop func(*Record) bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	var touched map[string]bool
	for k, r := range m.recs {
		if r.State.Resolved() && drop(r) {
			delete(m.recs, k)
			n++
			if r.Name != "" {
				if touched == nil {
					touched = make(map[string]bool)
				}
				touched[r.Name] = true
			}
		}
	}
	// Each touched Name's keys are filtered once, not searched once per
	// record dropped.
	for name := range touched {
		keys := slices.DeleteFunc(m.names[name], func(k string) bool {
			r, ok := m.recs[k]
			return !ok || r.Name != name
		})
		if len(keys) == 0 {
			delete(m.names, name)
		} else {
			m.names[name] = keys
		}
	}
	return n, nil
}
