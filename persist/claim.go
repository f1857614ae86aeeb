package persist

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// claimer is how this package's stores claim in one step (see Claim).
type claimer interface {
	claim(ctx context.Context, rec *Record) error
}

// claimMethod is the optional Claim method of a Store (see Store): it
// saves rec durably, as Save does, if and only if no record with rec.Key
// is stored and every stored record of rec.Name has a Seq lower than
// rec.Seq: rec becomes the action's latest intent. The check and the save
// are one step: of two Claims for one Name and Seq one wins. Otherwise it
// saves nothing and returns a *ConflictError that holds the action's
// latest record. A Name that some unreadable record may hold is refused
// with that record's *CorruptError.
type claimMethod interface {
	Claim(ctx context.Context, rec *Record) error
}

// ConflictError is returned by Claim, SaveIf and DeleteIf when the store
// holds another record than the write expects: nothing is written.
type ConflictError struct {
	// Key is the key of the refused write.
	Key string
	// Current is the stored record that refused it: for Claim, the
	// action's latest record; for SaveIf and DeleteIf, the record stored
	// with Key, nil if none is.
	Current *Record
}

func (e *ConflictError) Error() string {
	if e.Current == nil {
		return fmt.Sprintf("persist: conflict: intent %s was not written, it is no longer stored", e.Key)
	}
	return fmt.Sprintf("persist: conflict: intent %s was not written, the store holds intent %s (seq %d, state %s)",
		e.Key, e.Current.Key, e.Current.Seq, e.Current.State)
}

// Claim saves rec in s as the latest intent of its Name, if no record of
// the Name has rec's Seq or a higher one, nor rec's Key; otherwise it
// saves nothing and returns a *ConflictError holding the action's latest
// record. A record without a Name belongs to no action and is saved as
// Save does. The stores of this package, and a Store with a Claim method
// (see Store), check and save in one step, so that two clients sharing the
// store (two parts of one app, each with its own idem.Client) never both
// make an intent for one action, nor replace one the other is sending.
// Any other Store gets a List of rec.Name and then a Save, under one lock
// of this process (see oneStep): Clients of one process on such a store
// are arbitrated, Clients of two processes sharing it are not.
func Claim(ctx context.Context, s Store, rec *Record) error {
	if rec != nil && rec.Name == "" {
		return s.Save(ctx, rec)
	}
	switch c := s.(type) {
	case claimMethod:
		return c.Claim(ctx, rec)
	case claimer:
		return c.claim(ctx, rec)
	}
	if err := checkSave(rec); err != nil {
		return err
	}
	oneStep.Lock()
	defer oneStep.Unlock()
	recs, err := s.List(ctx, Filter{Name: rec.Name})
	if err != nil {
		return err
	}
	if err := claimable(recs, rec); err != nil {
		return err
	}
	return s.Save(ctx, rec)
}

// claimable reports a *ConflictError if rec cannot be the latest of recs, the
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
	return &ConflictError{Key: rec.Key, Current: latest(recs)}
}

// oneStep makes the read and the write of Claim, SaveIf and DeleteIf one
// step among the calls of this process on a Store that cannot do them in
// one step itself: a wrapper that embeds the Store of NewMemory, say,
// which keeps only the four methods of Store. Without it two Clients of
// one app on such a store could both arm an intent for one action, each
// with its own key, and the action would be paid twice. One lock for all
// such stores: they are rare, and a device makes few of these calls.
var oneStep sync.Mutex

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

// swapper is how this package's stores change or delete a record only
// if it is still the version read, in one step (see SaveIf).
type swapper interface {
	saveIf(ctx context.Context, rec, old *Record) error
	deleteIf(ctx context.Context, old *Record) error
}

// swapMethods are the optional SaveIf and DeleteIf methods of a Store
// (see Store).
type swapMethods interface {
	// SaveIf saves rec durably, as Save does, if and only if the record
	// stored with rec.Key is old's version (see sameVersion). Otherwise it
	// saves nothing and returns a *ConflictError holding the stored
	// record, nil if none is stored. The check and the save are one step
	// among SaveIfs, DeleteIfs and Claims.
	SaveIf(ctx context.Context, rec, old *Record) error
	// DeleteIf deletes the record stored with old.Key if and only if it is
	// old's version, in one step as SaveIf; otherwise it deletes nothing
	// and returns a *ConflictError. No record stored is not an error.
	DeleteIf(ctx context.Context, old *Record) error
}

// sameVersion reports whether a and b are the same version of one record:
// the same key, state, holder, attempts and time of the last write.
func sameVersion(a, b *Record) bool {
	return a != nil && b != nil && a.Key == b.Key && a.State == b.State &&
		a.Holder == b.Holder && a.Attempts == b.Attempts && a.UpdatedAt.Equal(b.UpdatedAt)
}

// SaveIf saves rec in s if the record stored with rec.Key is old's
// version (the same key, state, holder, attempts and time of the last
// write); otherwise it saves nothing and returns a *ConflictError holding
// the stored record, nil if none is. The stores of this package, and a
// Store with SaveIf and DeleteIf methods (see Store), check and save in
// one step among SaveIfs, DeleteIfs and Claims, so that a client that
// takes over an armed intent to send it and the client that armed it
// (replacing it for a changed cart) cannot both win. Any other Store gets
// a Get and then a Save under one lock of this process (see oneStep):
// Clients of one process on such a store are arbitrated, Clients of two
// processes sharing it are not. An old of another key than rec's, or none,
// is refused.
func SaveIf(ctx context.Context, s Store, rec, old *Record) error {
	if old == nil || rec != nil && rec.Key != old.Key {
		return errors.New("persist: SaveIf needs the version of rec's own key that rec replaces")
	}
	switch sw := s.(type) {
	case swapMethods:
		return sw.SaveIf(ctx, rec, old)
	case swapper:
		return sw.saveIf(ctx, rec, old)
	}
	if err := checkSave(rec); err != nil {
		return err
	}
	oneStep.Lock()
	defer oneStep.Unlock()
	if err := unchanged(ctx, s, old); err != nil {
		return err
	}
	return s.Save(ctx, rec)
}

// DeleteIf deletes old's record from s if it is still old's version, in
// one step as SaveIf; otherwise it deletes nothing and returns a
// *ConflictError. No record stored is not an error. Without the methods,
// a Get and then a Delete, under the lock of SaveIf. A nil old is
// refused.
func DeleteIf(ctx context.Context, s Store, old *Record) error {
	if old == nil {
		return errors.New("persist: DeleteIf needs the version it deletes")
	}
	switch sw := s.(type) {
	case swapMethods:
		return sw.DeleteIf(ctx, old)
	case swapper:
		return sw.deleteIf(ctx, old)
	}
	oneStep.Lock()
	defer oneStep.Unlock()
	return deleteUnchanged(ctx, s, old)
}

// deleteUnchanged is DeleteIf through s's Get and Delete.
func deleteUnchanged(ctx context.Context, s Store, old *Record) error {
	err := unchanged(ctx, s, old)
	var ce *ConflictError
	if errors.As(err, &ce) && ce.Current == nil {
		return nil
	}
	if err != nil {
		return err
	}
	return s.Delete(ctx, old.Key)
}

// unchanged returns nil if the record stored with old.Key is old's
// version, a *ConflictError if it is another or none, or the store's
// error.
func unchanged(ctx context.Context, s Store, old *Record) error {
	cur, err := s.Get(ctx, old.Key)
	if errors.Is(err, ErrNotFound) {
		return &ConflictError{Key: old.Key}
	}
	if err != nil {
		return err
	}
	if !sameVersion(cur, old) {
		return &ConflictError{Key: old.Key, Current: cur}
	}
	return nil
}
