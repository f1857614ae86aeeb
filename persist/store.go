package persist

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Options configures a store. A nil *Options and the zero Options both
// mean the defaults, which keep everything a Record holds.
type Options struct {
	// DiscardResponseBodies makes the store drop Response.Body on Write.
	// The stored Response keeps its status code, headers and Replayed
	// flag. Set it in apps that must not keep response bodies at rest. The
	// zero value keeps bodies.
	DiscardResponseBodies bool
}

// PruneFunc deletes from s the resolved records for which drop returns
// true. It returns how many it deleted. Unresolved records are never
// deleted, nor passed to drop, whatever their age. Their outcome is
// unknown, and only the app can settle them. drop gets a copy it may
// keep. Through it, idem's Client.Prune judges the ages by every clock
// the device has.
//
// Each record is deleted only if it is still the version listed
// (Delete). So one written again while pruning runs is never deleted by
// mistake.
//
// Records that cannot be read are left alone. PruneFunc deletes the
// readable ones. It returns the *CorruptError for each unreadable one,
// as List does.
func PruneFunc(ctx context.Context, s Store, drop func(*Record) bool) (int, error) {
	recs, listErr := s.List(ctx, Filter{})
	var corrupt *CorruptError
	if listErr != nil && !errors.As(listErr, &corrupt) {
		return 0, listErr
	}
	n := 0
	var errs []error
	for _, r := range recs {
		if !r.State.Resolved() || !drop(r.Clone()) {
			continue
		}
		err := s.Delete(ctx, r)
		if errors.As(err, new(*ConflictError)) {
			continue // changed since listed: not what drop judged
		}
		if err != nil {
			errs = append(errs, err)
			break
		}
		n++
	}
	return n, errors.Join(append(errs, listErr)...)
}

// prepare returns the copy a store keeps of rec, a valid record (see
// checkWrite). The copy has the format version set, and times in UTC. Its
// empty headers and bodies are nil. Its response body is dropped if opts
// say so. Both stores keep exactly this. So a record reads back the same
// from either.
func prepare(rec *Record, opts Options) *Record {
	return normalized(rec.Clone(), opts)
}

// prepareShared is prepare for a record whose headers and bodies the
// caller never changes (WithDeferredSync). The copy it returns shares
// them with rec. normalize and opts only replace fields of the copy. They
// never write through them.
//
// Clocks and Response already in normal form are shared too. normalize
// leaves them as they are. Only one it must change is copied first.
func prepareShared(rec *Record, opts Options) *Record {
	r := *rec
	if rec.Clocks != nil && !normalClocks(rec.Clocks) {
		cl := *rec.Clocks
		r.Clocks = &cl
	}
	if resp := rec.Response; resp != nil && (!normalResponse(resp) || opts.DiscardResponseBodies && resp.Body != nil) {
		c := *resp
		r.Response = &c
	}
	return normalized(&r, opts)
}

// normalClocks reports whether normalize leaves cl as it is.
func normalClocks(cl *Clocks) bool {
	return cl.ArmMark.Location() == time.UTC && cl.Mark.Location() == time.UTC
}

// normalResponse reports whether normalize leaves resp as it is.
func normalResponse(resp *Response) bool {
	return normalHeader(resp.Header) && (resp.Body == nil || len(resp.Body) > 0)
}

// normalHeader reports whether normHeader returns h itself.
func normalHeader(h http.Header) bool {
	if h == nil {
		return true
	}
	if len(h) == 0 {
		return false
	}
	for _, vs := range h {
		if vs != nil && len(vs) == 0 {
			return false
		}
	}
	return true
}

// normalized sets r's format version, normalizes it and applies opts.
func normalized(r *Record, opts Options) *Record {
	r.Version = FormatVersion
	normalize(r)
	if opts.DiscardResponseBodies && r.Response != nil && r.Response.Body != nil {
		r.Response.Body = nil
	}
	return r
}

// normalize puts r in the one form that survives encoding unchanged. It
// changes r's Clocks and Response in place. r owns them: they are a
// clone, or a copy made by prepareShared.
func normalize(r *Record) {
	r.CreatedAt = r.CreatedAt.UTC()
	r.UpdatedAt = r.UpdatedAt.UTC()
	if cl := r.Clocks; cl != nil && !normalClocks(cl) {
		cl.ArmMark, cl.Mark = cl.ArmMark.UTC(), cl.Mark.UTC()
	}
	r.Header = normHeader(r.Header)
	if len(r.Body) == 0 {
		r.Body = nil
	}
	if r.Response != nil && !normalResponse(r.Response) {
		r.Response.Header = normHeader(r.Response.Header)
		if len(r.Response.Body) == 0 {
			r.Response.Body = nil
		}
	}
}

// normHeader returns h as a store keeps it. An empty h is nil. So is a
// field without values, as the index gives it back. normHeader copies h
// rather than change it, as h may be the caller's.
func normHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	if normalHeader(h) {
		return h
	}
	h = h.Clone()
	for k, vs := range h {
		if vs != nil && len(vs) == 0 {
			h[k] = nil
		}
	}
	return h
}

// sortRecords orders recs as List returns them. The oldest CreatedAt
// comes first. Records created at the same instant go by Key.
func sortRecords(recs []*Record) {
	slices.SortFunc(recs, func(a, b *Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
}
