package persist

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Options configures a store. A nil *Options and the zero Options both mean
// the defaults, which keep everything a Record holds.
type Options struct {
	// DiscardResponseBodies makes the store drop Response.Body on Save: the
	// stored Response keeps its status code, headers and Replayed flag. Set
	// it in apps that must not keep response bodies at rest. The zero value
	// keeps bodies.
	DiscardResponseBodies bool
}

// pruner is an optional interface for a Store that can delete resolved
// records in one step, so that a record saved again while pruning runs is
// never deleted by mistake. Prune uses it when a Store implements it.
type pruner interface {
	// Prune deletes the resolved records last updated before before and
	// returns how many it deleted. It follows the rules of the function
	// Prune.
	Prune(ctx context.Context, before time.Time) (int, error)
}

// Prune deletes from s the resolved records whose UpdatedAt (or CreatedAt,
// if UpdatedAt is zero) is before before, and returns how many it deleted.
// Unresolved records are never deleted, whatever their age: their outcome is
// unknown and only the app can settle them.
//
// Records that cannot be read are left alone; Prune deletes the readable
// ones and returns the *CorruptError for each unreadable one, as List does.
//
// If s implements pruner, Prune calls it. Otherwise Prune lists and deletes
// one record at a time, and a record that another goroutine saves again in
// between may be deleted: stores used concurrently with Prune should
// implement pruner, as Memory and FileStore do.
func Prune(ctx context.Context, s Store, before time.Time) (int, error) {
	if p, ok := s.(pruner); ok {
		return p.Prune(ctx, before)
	}
	recs, listErr := s.List(ctx, Filter{})
	var corrupt *CorruptError
	if listErr != nil && !errors.As(listErr, &corrupt) {
		return 0, listErr
	}
	n := 0
	for _, r := range recs {
		if !prunable(r, before) {
			continue
		}
		if err := s.Delete(ctx, r.Key); err != nil {
			return n, errors.Join(err, listErr)
		}
		n++
	}
	return n, listErr
}

// prunable reports whether Prune may delete r.
func prunable(r *Record, before time.Time) bool {
	t := r.UpdatedAt
	if t.IsZero() {
		t = r.CreatedAt
	}
	return r.State.Resolved() && t.Before(before)
}

// funcPruner is an optional interface of a Store that deletes, in one
// step, the resolved records a function selects. PruneFunc uses it when a
// Store implements it, as Memory and FileStore do.
type funcPruner interface {
	// PruneFunc deletes the resolved records for which drop returns true
	// and returns how many it deleted. drop is called with the store's
	// lock held: it must not call the store. It follows the rules of the
	// function PruneFunc.
	PruneFunc(ctx context.Context, drop func(*Record) bool) (int, error)
}

// PruneFunc deletes from s the resolved records for which drop returns
// true, as Prune does for those last updated before a time: unresolved
// records are never deleted, nor passed to drop, and unreadable ones are
// left alone and reported. drop gets a copy it may keep. idem's
// Client.Prune judges the ages through it by every clock the device has.
func PruneFunc(ctx context.Context, s Store, drop func(*Record) bool) (int, error) {
	if p, ok := s.(funcPruner); ok {
		return p.PruneFunc(ctx, func(r *Record) bool { return r.State.Resolved() && drop(r.Clone()) })
	}
	recs, listErr := s.List(ctx, Filter{})
	var corrupt *CorruptError
	if listErr != nil && !errors.As(listErr, &corrupt) {
		return 0, listErr
	}
	n := 0
	for _, r := range recs {
		if !r.State.Resolved() || !drop(r) {
			continue
		}
		if err := s.Delete(ctx, r.Key); err != nil {
			return n, errors.Join(err, listErr)
		}
		n++
	}
	return n, listErr
}

// saveShared saves rec in s as s.Save does, for a caller that never
// changes rec, its headers, bodies or response after the call (as
// SaveDeferred's callers promise): a Memory keeps such a record without
// copying it, sharing its headers and bodies; any other store is given rec
// through Save. Records handed out by Get and List are copies all the same.
func saveShared(ctx context.Context, s Store, rec *Record) error {
	// Only a Memory itself: a type that embeds one and has its own Save
	// gets rec through that Save.
	if m, ok := s.(*Memory); ok {
		return m.saveShared(ctx, rec)
	}
	return s.Save(ctx, rec)
}

// deferredSaver is an optional interface of a Store that can save a
// record so that it survives a crash of the process at once, and a power
// loss only moments later, off the caller's path.
type deferredSaver interface {
	// SaveDeferred saves rec as Save does, except that when it returns
	// nil the record may not yet be safe from a power loss: it is read
	// back, and survives the process being killed, at once; it becomes
	// durable in the background, and Close waits for that. A power loss
	// before then leaves the key holding its previous version, whole,
	// never a damaged one. A store does this only where it can keep that
	// promise, and saves durably otherwise.
	SaveDeferred(ctx context.Context, rec *Record) error
}

// SaveDeferred saves rec in s through deferredSaver if s implements it,
// and through Save otherwise (a Memory keeps rec without copying it): rec
// must not be changed after the call.
func SaveDeferred(ctx context.Context, s Store, rec *Record) error {
	if ds, ok := s.(deferredSaver); ok {
		return ds.SaveDeferred(ctx, rec)
	}
	return saveShared(ctx, s, rec)
}

// prepare validates rec and returns the copy a store keeps: the format
// version set, times in UTC, empty headers and bodies as nil, and the
// response body dropped if opts say so. Both stores keep exactly this, so a
// record reads back the same from either.
func prepare(rec *Record, opts Options) (*Record, error) {
	if err := checkSave(rec); err != nil {
		return nil, err
	}
	return normalized(rec.Clone(), opts), nil
}

// checkSave reports why rec cannot be saved, or nil.
func checkSave(rec *Record) error {
	if rec == nil {
		return errors.New("persist: cannot save a nil record")
	}
	if err := rec.Validate(); err != nil {
		return err
	}
	for _, t := range [2]time.Time{rec.CreatedAt, rec.UpdatedAt} {
		// Outside these years a time has no RFC 3339 form, so a file store
		// could not write it; every store refuses it alike.
		if y := t.Year(); !t.IsZero() && (y < 0 || y > 9999) {
			return fmt.Errorf("persist: record %s has a time outside years 0-9999: %v", rec.Key, t)
		}
	}
	return nil
}

// prepareShared is prepare for a record whose headers and bodies the
// caller never changes (saveShared): the copy it returns shares them with
// rec. normalize and opts only replace fields of the copy, never write
// through them.
func prepareShared(rec *Record, opts Options) (*Record, error) {
	if err := checkSave(rec); err != nil {
		return nil, err
	}
	r := *rec
	if rec.Clocks != nil {
		cl := *rec.Clocks
		r.Clocks = &cl
	}
	if rec.Response != nil {
		resp := *rec.Response
		r.Response = &resp
	}
	return normalized(&r, opts), nil
}

// normalized sets r's format version, normalizes it and applies opts.
func normalized(r *Record, opts Options) *Record {
	r.Version = FormatVersion
	normalize(r)
	if opts.DiscardResponseBodies && r.Response != nil {
		r.Response.Body = nil
	}
	return r
}

// normalize puts r in the one form that survives encoding unchanged. It
// changes r's Clocks and Response in place: r owns them (a clone, or a
// copy made by prepareShared).
func normalize(r *Record) {
	r.CreatedAt = utc(r.CreatedAt)
	r.UpdatedAt = utc(r.UpdatedAt)
	if cl := r.Clocks; cl != nil {
		cl.ArmMark, cl.Mark = utc(cl.ArmMark), utc(cl.Mark)
	}
	if len(r.Header) == 0 {
		r.Header = nil
	}
	if len(r.Body) == 0 {
		r.Body = nil
	}
	if r.Response != nil {
		if len(r.Response.Header) == 0 {
			r.Response.Header = nil
		}
		if len(r.Response.Body) == 0 {
			r.Response.Body = nil
		}
	}
}

// utc returns t in UTC without its monotonic reading; the zero time stays
// the zero time.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// sortRecords orders recs as List returns them: oldest CreatedAt first, and
// by Key among records created at the same instant.
func sortRecords(recs []*Record) {
	slices.SortFunc(recs, func(a, b *Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
}
