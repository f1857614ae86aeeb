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

// funcPruner is how this package's stores prune in one step (see
// PruneFunc): drop is called with the store's lock held.
type funcPruner interface {
	pruneFunc(ctx context.Context, drop func(*Record) bool) (int, error)
}

// pruneFuncMethod is the optional PruneFunc method of a Store (see
// Store).
type pruneFuncMethod interface {
	// PruneFunc deletes the resolved records for which drop returns true
	// and returns how many it deleted. drop is called with the store's
	// lock held: it must not call the store. It follows the rules of the
	// function PruneFunc.
	PruneFunc(ctx context.Context, drop func(*Record) bool) (int, error)
}

// PruneFunc deletes from s the resolved records for which drop returns
// true, and returns how many it deleted. Unresolved records are never
// deleted, nor passed to drop, whatever their age: their outcome is
// unknown and only the app can settle them. drop gets a copy it may keep.
// idem's Client.Prune judges the ages through it by every clock the device
// has.
//
// Records that cannot be read are left alone; PruneFunc deletes the
// readable ones and returns the *CorruptError for each unreadable one, as
// List does.
//
// The stores of this package, and a Store with a PruneFunc method (see
// Store), delete in one step, so that a record saved again while pruning
// runs is never deleted by mistake. Any other Store gets a List and a
// Delete for each record, and a record that another goroutine saves again
// in between may be deleted.
func PruneFunc(ctx context.Context, s Store, drop func(*Record) bool) (int, error) {
	resolvedDrop := func(r *Record) bool { return r.State.Resolved() && drop(r.Clone()) }
	switch p := s.(type) {
	case pruneFuncMethod:
		return p.PruneFunc(ctx, resolvedDrop)
	case funcPruner:
		return p.pruneFunc(ctx, resolvedDrop)
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
// SaveDeferred's callers promise): a memory store keeps such a record
// without copying it, sharing its headers and bodies; any other store is
// given rec through Save. Records handed out by Get and List are copies
// all the same.
func saveShared(ctx context.Context, s Store, rec *Record) error {
	// Only a memory store itself: a Store that wraps one gets rec through
	// its own Save.
	if m, ok := s.(*memory); ok {
		return m.saveShared(ctx, rec)
	}
	return s.Save(ctx, rec)
}

// deferredSaver is how this package's stores save off the caller's path
// (see SaveDeferred).
type deferredSaver interface {
	saveDeferred(ctx context.Context, rec *Record) error
}

// saveDeferredMethod is the optional SaveDeferred method of a Store (see
// Store).
type saveDeferredMethod interface {
	// SaveDeferred saves rec as Save does, except that when it returns
	// nil the record may not yet be safe from a power loss: it is read
	// back, and survives the process being killed, at once; it becomes
	// durable in the background, and Close waits for that. A power loss
	// before then leaves the key holding its previous version, whole,
	// never a damaged one. A store does this only where it can keep that
	// promise, and saves durably otherwise.
	SaveDeferred(ctx context.Context, rec *Record) error
}

// SaveDeferred saves rec in s as Save does, except that a store that can
// makes it durable in the background: when SaveDeferred returns nil the
// record is read back, and survives the process being killed, at once,
// and a power loss before its sync leaves the key's previous version,
// whole. A FileStore does so where it can keep that promise (see the
// package docs), a Store with a SaveDeferred method (see Store) as that
// method does; any other store saves through Save, except that a store
// made by NewMemory keeps rec without copying it. rec must not be changed
// after the call.
func SaveDeferred(ctx context.Context, s Store, rec *Record) error {
	switch ds := s.(type) {
	case saveDeferredMethod:
		return ds.SaveDeferred(ctx, rec)
	case deferredSaver:
		return ds.saveDeferred(ctx, rec)
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
