package idempotency

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/clock"
)

// MemoryStore is a [Store] in memory, for tests and the fake server. One
// mutex makes every method one atomic step. Commit hooks run under it. It
// keeps records under the [PrincipalDigest] of their principal, as every
// store does. A MemoryStore is safe for concurrent use by multiple
// goroutines. The zero MemoryStore is empty and ready to use:
//
//	store := &idempotency.MemoryStore{Clock: clk}
//
// Set its fields before its first use, and do not copy it after.
type MemoryStore struct {
	// Clock, when not nil, is the store's own clock ([Store]). The store
	// judges leases and retention on it, whatever its callers' clocks
	// tell. Nil takes its callers' times as they come. That is right only
	// while they all read one clock. When callers' clocks may differ,
	// give it the test's clock.Manual, or the system clock.
	Clock clock.Clock
	// MaxRecords, when positive, bounds the number of records. Once the
	// store holds MaxRecords, Insert deletes the expired records. If there
	// are none, it refuses a new record with an error matching
	// [ErrStoreFull]. The error says when the earliest record expires. The
	// middleware sends that as Retry-After. Zero or negative means no
	// bound.
	MaxRecords int

	mu   sync.Mutex
	recs map[ID]*Record
	// minExpiry is at or before the earliest liveUntil of the records. So a
	// full store sweeps only once something may have expired.
	minExpiry time.Time
}

// now returns the store's time: its clock's, or else the caller's.
func (s *MemoryStore) now(caller time.Time) time.Time {
	if s.Clock == nil {
		return caller
	}
	return s.Clock.Now()
}

// Insert implements [Store].
func (s *MemoryStore) Insert(_ context.Context, rec *Record) (*Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now(rec.CreatedAt)
	at := digested(rec.ID)
	old, ok := s.recs[at]
	if ok && !old.Expired(now) {
		cp := *old
		cp.ID, cp.ReadAt = rec.ID, now
		return &cp, false, nil
	}
	if !ok && s.MaxRecords > 0 && len(s.recs) >= s.MaxRecords {
		if !s.minExpiry.After(now) {
			s.sweep(now)
		}
		if len(s.recs) >= s.MaxRecords {
			return nil, false, &fullError{Until: s.minExpiry, Now: now}
		}
	}
	cp := *rec
	cp.CreatedAt, cp.ExpiresAt = now, now.Add(rec.ExpiresAt.Sub(rec.CreatedAt))
	if !rec.LockedUntil.IsZero() {
		cp.LockedUntil = now.Add(rec.LockedUntil.Sub(rec.CreatedAt))
	}
	cp.ID = at
	if s.recs == nil {
		s.recs = make(map[ID]*Record)
	}
	s.recs[at] = &cp
	if s.minExpiry.IsZero() || cp.ExpiresAt.Before(s.minExpiry) {
		s.minExpiry = cp.ExpiresAt
	}
	return nil, true, nil
}

// TakeOver implements [Store].
func (s *MemoryStore) TakeOver(_ context.Context, id ID, from, to string, now, until time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lease := until.Sub(now)
	now = s.now(now)
	r, ok := s.recs[digested(id)]
	if !ok || r.Status != StatusInProgress || r.Owner != from || (to != "" && r.LockedUntil.After(now)) || r.Expired(now) {
		return false, nil
	}
	r.Owner = to
	r.LockedUntil = now.Add(lease)
	return true, nil
}

// Complete implements [Store].
func (s *MemoryStore) Complete(ctx context.Context, id ID, owner string, resp *Response, commit func(context.Context) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[digested(id)]
	if !ok || r.Status != StatusInProgress || r.Owner != owner {
		return ErrNotOwner
	}
	if commit != nil {
		if err := commit(ctx); err != nil {
			return err
		}
	}
	r.Status = StatusCompleted
	r.Owner = ""
	r.LockedUntil = time.Time{}
	r.Response = resp
	return nil
}

// Release implements [Store].
func (s *MemoryStore) Release(_ context.Context, id ID, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := digested(id)
	r, ok := s.recs[at]
	if !ok || r.Status != StatusInProgress || r.Owner != owner {
		return ErrNotOwner
	}
	delete(s.recs, at)
	return nil
}

// Get returns a copy of the live record id, if there is one. It judges
// by the store's clock, or by now without one. The reconcile lookup uses
// it to tell "never done" from "not settled yet".
func (s *MemoryStore) Get(_ context.Context, id ID, now time.Time) (*Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now = s.now(now)
	r, ok := s.recs[digested(id)]
	if !ok || r.Expired(now) {
		return nil, false
	}
	cp := *r
	cp.ID, cp.ReadAt = id, now
	return &cp, true
}

// Sweep implements [Store].
func (s *MemoryStore) Sweep(_ context.Context, now time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweep(s.now(now)), nil
}

// sweep deletes the records expired at now and makes minExpiry exact.
func (s *MemoryStore) sweep(now time.Time) int {
	n := 0
	s.minExpiry = time.Time{}
	for id, r := range s.recs {
		if r.Expired(now) {
			delete(s.recs, id)
			n++
		} else if s.minExpiry.IsZero() || r.liveUntil().Before(s.minExpiry) {
			s.minExpiry = r.liveUntil()
		}
	}
	return n
}

// Count returns the number of stored records, and how many of them are
// IN_PROGRESS. Expired records count until they are swept.
func (s *MemoryStore) Count(context.Context) (records, inProgress int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recs {
		if r.Status == StatusInProgress {
			inProgress++
		}
	}
	return len(s.recs), inProgress, nil
}

// Clear deletes every record.
func (s *MemoryStore) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.recs)
	s.minExpiry = time.Time{}
}

// digested is id as a store keeps it, with its principal's digest.
func digested(id ID) ID { return ID{Principal: PrincipalDigest(id.Principal), Key: id.Key} }
