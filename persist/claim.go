package persist

import (
	"context"
	"errors"
	"fmt"
)

// Claimer is an optional interface of a Store that decides "the latest
// intent of this action" atomically, so that two clients sharing the store
// (two parts of one app, each with its own idem.Client) never both make an
// intent for one action, nor replace one the other is sending. Memory and
// FileStore implement it; Claim uses it when a Store does.
type Claimer interface {
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
// Claimer.Claim does. A record without a Name belongs to no action and is
// saved as Save does. A Store that does not implement Claimer gets a List
// of rec.Name and then a Save: one process's calls through one idem.Client
// are serialised by the Client, but two Clients on such a store are not
// arbitrated.
func Claim(ctx context.Context, s Store, rec *Record) error {
	if rec != nil && rec.Name == "" {
		return s.Save(ctx, rec)
	}
	if c, ok := s.(Claimer); ok {
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
	return &ClaimError{Latest: Latest(recs)}
}

// Latest returns the intent created last among recs, the records of one
// Name: the highest Seq, which no setting of the device's clock moves.
// Records written before Seq existed have none and come first, ordered by
// creation time. recs must not be empty.
func Latest(recs []*Record) *Record {
	latest := recs[0]
	for _, r := range recs[1:] {
		if r.Seq > latest.Seq || r.Seq == latest.Seq && !r.CreatedAt.Before(latest.CreatedAt) {
			latest = r
		}
	}
	return latest
}
