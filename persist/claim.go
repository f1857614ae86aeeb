package persist

import (
	"context"
	"errors"
	"fmt"
)

// claimer is an optional interface of a Store that decides "the latest
// intent of this action" atomically, so that two clients sharing the store
// (two parts of one app, each with its own idem.Client) never both make an
// intent for one action, nor replace one the other is sending. Memory and
// FileStore implement it; Claim uses it when a Store does.
type claimer interface {
	// Claim saves rec durably, as Save does, if and only if no record with
	// rec.Key is stored and every stored record of rec.Name has a Seq
	// lower than rec.Seq: rec becomes the action's latest intent. The
	// check and the save are one step: of two Claims for one Name and Seq
	// one wins. Otherwise it saves nothing and returns a *ClaimError that
	// holds the action's latest record. A Name that some unreadable
	// record may hold is refused with that record's *CorruptError.
	Claim(ctx context.Context, rec *Record) error
}

// ErrClaimed is matched by the *ClaimError of a Claim that lost: the
// action has a record as late as the claimed one or later.
var ErrClaimed = errors.New("persist: another intent is the action's latest")

// ClaimError is returned by Claim when the action already has a record as
// late as the claimed one, or one with the claimed key.
type ClaimError struct {
	// Latest is the action's latest record, as stored.
	Latest *Record
}

func (e *ClaimError) Error() string {
	return fmt.Sprintf("%v: intent %s (seq %d)", ErrClaimed, e.Latest.Key, e.Latest.Seq)
}

func (e *ClaimError) Unwrap() error { return ErrClaimed }

// Claim saves rec in s as the latest intent of its Name, as
// claimer.Claim does. A record without a Name belongs to no action and is
// saved as Save does. A Store that does not implement claimer gets a List
// of rec.Name and then a Save: one process's calls through one idem.Client
// are serialised by the Client, but two Clients on such a store are not
// arbitrated.
func Claim(ctx context.Context, s Store, rec *Record) error {
	if rec != nil && rec.Name == "" {
		return s.Save(ctx, rec)
	}
	if c, ok := s.(claimer); ok {
		return c.Claim(ctx, rec)
	}
	if err := checkSave(rec); err != nil {
		return err
	}
	recs, err := s.List(ctx, Filter{Name: rec.Name})
	if err != nil {
		return err
	}
	if err := claimable(recs, rec); err != nil {
		return err
	}
	return s.Save(ctx, rec)
}

// claimable reports a *ClaimError if rec cannot be the latest of recs, the
// records of its Name.
func claimable(recs []*Record, rec *Record) error {
	var lost bool
	for _, r := range recs {
		if r.Key == rec.Key || r.Seq >= rec.Seq {
			lost = true
		}
	}
	if !lost {
		return nil
	}
	return &ClaimError{Latest: latest(recs)}
}

// latest returns the intent created last among recs, the records of one
// Name: the highest Seq, which no setting of the device's clock moves.
// Records written before Seq existed have none and come first, ordered by
// creation time. recs must not be empty.
func latest(recs []*Record) *Record {
	latest := recs[0]
	for _, r := range recs[1:] {
		if r.Seq > latest.Seq || r.Seq == latest.Seq && !r.CreatedAt.Before(latest.CreatedAt) {
			latest = r
		}
	}
	return latest
}

// swapper is an optional interface of a Store that changes or deletes a
// record only if it is still the version the caller read, in one step, so
// that a client that takes over an armed intent to send it (a second
// Client on the store resuming it) and the client that armed it (replacing
// it for a changed cart) cannot both win. Memory and FileStore implement
// it; SaveIf and DeleteIf use it when a Store does.
type swapper interface {
	// SaveIf saves rec durably, as Save does, if and only if the record
	// stored with rec.Key is old's version (see sameVersion). Otherwise it
	// saves nothing and returns a *ChangedError holding the stored record,
	// nil if none is stored. The check and the save are one step among
	// SaveIfs, DeleteIfs and Claims.
	SaveIf(ctx context.Context, rec, old *Record) error
	// DeleteIf deletes the record stored with old.Key if and only if it is
	// old's version, in one step as SaveIf; otherwise it deletes nothing
	// and returns a *ChangedError. No record stored is not an error.
	DeleteIf(ctx context.Context, old *Record) error
}

// ErrChanged is matched by the *ChangedError of a SaveIf or DeleteIf whose
// record is no longer the version the caller read.
var ErrChanged = errors.New("persist: the record changed since it was read")

// ChangedError is returned by SaveIf and DeleteIf when the stored record is
// another version than the caller's.
type ChangedError struct {
	Key string
	// Current is the record as stored, nil if none is.
	Current *Record
}

func (e *ChangedError) Error() string {
	if e.Current == nil {
		return fmt.Sprintf("%v: intent %s is no longer stored", ErrChanged, e.Key)
	}
	return fmt.Sprintf("%v: intent %s (state %s)", ErrChanged, e.Key, e.Current.State)
}

func (e *ChangedError) Unwrap() error { return ErrChanged }

// sameVersion reports whether a and b are the same version of one record:
// the same key, state, holder, attempts and time of the last write.
func sameVersion(a, b *Record) bool {
	return a != nil && b != nil && a.Key == b.Key && a.State == b.State &&
		a.Holder == b.Holder && a.Attempts == b.Attempts && a.UpdatedAt.Equal(b.UpdatedAt)
}

// SaveIf saves rec in s if the stored record with rec.Key is old's version,
// as swapper.SaveIf does. A Store that does not implement swapper gets a
// Get and then a Save: not one step, so two Clients on such a store are
// not arbitrated.
func SaveIf(ctx context.Context, s Store, rec, old *Record) error {
	if sw, ok := s.(swapper); ok {
		return sw.SaveIf(ctx, rec, old)
	}
	if err := checkSave(rec); err != nil {
		return err
	}
	if err := unchanged(ctx, s, old); err != nil {
		return err
	}
	return s.Save(ctx, rec)
}

// DeleteIf deletes old's record from s if it is still old's version, as
// swapper.DeleteIf does; without swapper, a Get and then a Delete.
func DeleteIf(ctx context.Context, s Store, old *Record) error {
	if sw, ok := s.(swapper); ok {
		return sw.DeleteIf(ctx, old)
	}
	err := unchanged(ctx, s, old)
	var ce *ChangedError
	if errors.As(err, &ce) && ce.Current == nil {
		return nil
	}
	if err != nil {
		return err
	}
	return s.Delete(ctx, old.Key)
}

// unchanged returns nil if the record stored with old.Key is old's
// version, a *ChangedError if it is another or none, or the store's error.
func unchanged(ctx context.Context, s Store, old *Record) error {
	cur, err := s.Get(ctx, old.Key)
	if errors.Is(err, ErrNotFound) {
		return &ChangedError{Key: old.Key}
	}
	if err != nil {
		return err
	}
	if !sameVersion(cur, old) {
		return &ChangedError{Key: old.Key, Current: cur}
	}
	return nil
}
