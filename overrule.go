package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/persist"
)

// overrulingStore is the Client's view of its store. A stored void may be
// false. Another Client concluded it from the server's miss. Then this
// Client got the server's word that the intent was done (arbitrate,
// recordLookup). When the store refused to write that word over the void,
// this Client remembers it (keys.overruled). Through this view, no read of
// this Client returns that void. The read writes the word over it first.
// While the store refuses, Get fails and List leaves the intent out, each
// with an error that matches ErrOutcomeUnknown. Other Clients, and this
// one after a restart, still read the void.
type overrulingStore struct {
	persist.Store
	keys *keys
	rev  func() string
	now  func() time.Time
}

// Get is the store's Get, with an overruled void written over first.
func (s *overrulingStore) Get(ctx context.Context, key string) (*persist.Record, error) {
	rec, err := s.Store.Get(ctx, key)
	if err != nil || rec.State != persist.StateVoid || !s.keys.anyOverruled() {
		return rec, err
	}
	return s.overrule(ctx, rec)
}

// List is the store's List, with each overruled void written over first.
// A void is resolved, so a list of the unresolved never holds one. Such a
// list gets each overruled intent that the word leaves unresolved.
func (s *overrulingStore) List(ctx context.Context, f persist.Filter) ([]*persist.Record, error) {
	recs, err := s.Store.List(ctx, f)
	if !s.keys.anyOverruled() {
		return recs, err
	}
	errs := []error{err}
	out := recs[:0]
	for _, rec := range recs {
		if rec.State == persist.StateVoid {
			var oerr error
			if rec, oerr = s.overrule(ctx, rec); oerr != nil {
				errs = append(errs, oerr)
				continue
			}
		}
		out = append(out, rec)
	}
	if !f.Unresolved {
		return out, errors.Join(errs...)
	}
	added := false
	for _, key := range s.keys.overruledKeys() {
		rec, gerr := s.Get(ctx, key)
		switch {
		case errors.Is(gerr, persist.ErrNotFound):
			continue
		case gerr != nil:
			errs = append(errs, gerr)
			continue
		case rec.State.Resolved() || f.Name != "" && rec.Name != f.Name:
			continue
		case slices.ContainsFunc(out, func(r *persist.Record) bool { return r.Key == rec.Key }):
			continue
		}
		out, added = append(out, rec), true
	}
	if added {
		slices.SortStableFunc(out, func(a, b *persist.Record) int { return a.CreatedAt.Compare(b.CreatedAt) })
	}
	return out, errors.Join(errs...)
}

// overrule writes the word this Client holds for void's intent over void,
// and returns what is then stored. Without a word it returns void.
func (s *overrulingStore) overrule(ctx context.Context, void *persist.Record) (*persist.Record, error) {
	word := s.keys.overruling(void.Key)
	if word == nil {
		return void, nil
	}
	rec := *word
	rec.Rev, rec.UpdatedAt = s.rev(), s.now()
	err := atActionEnd(detached(ctx), s.Store, &rec)
	if err == nil {
		err = s.Store.Write(detached(ctx), &rec, void)
	}
	var changed *persist.ConflictError
	switch {
	case err == nil:
	case errors.As(err, &changed) && changed.Current == nil:
		// Deleted meanwhile (Forget, Prune): nothing is left to tell.
		s.keys.upheld(void.Key)
		return nil, fmt.Errorf("idem: intent %s: %w", void.Key, persist.ErrNotFound)
	case errors.As(err, &changed) && changed.Current.State != persist.StateVoid:
		// Another read wrote the word first.
		s.keys.upheld(void.Key)
		return changed.Current, nil
	default:
		return nil, fmt.Errorf("idem: intent %s is stored void, but the server's word says it was done, and the store could not record that: %w: %w", void.Key, ErrOutcomeUnknown, err)
	}
	s.keys.upheld(void.Key)
	return &rec, nil
}
