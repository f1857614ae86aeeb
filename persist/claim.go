package persist

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"
)

// maxRev bounds a record's Rev. It is stored with every record, and a
// store compares it on every write.
const maxRev = 64

// NewRev returns a new version for a record: 128 random bits, as 26
// characters. Set it as the record's Rev before each Write.
func NewRev() string { return rand.Text() }

// SameVersion reports whether a and b are the same version of one
// record. They have the same Key and the same Rev, which is set. A writer
// whose Write ended in an error tells by it whether the write landed. It
// compares the record it wrote with the record read back, or with a
// *ConflictError's Current.
func SameVersion(a, b *Record) bool {
	return a != nil && b != nil && a.Rev != "" && a.Key == b.Key && a.Rev == b.Rev
}

// ConflictError is returned by Write and Delete when the store holds
// another record than the change expects. Nothing is changed.
type ConflictError struct {
	// Key is the key of the refused change.
	Key string
	// Current is the stored record that refused it. For a Write of a new
	// intent (old == nil), it is the action's latest record. Otherwise it
	// is the record stored with Key, nil if none is.
	Current *Record
}

func (e *ConflictError) Error() string {
	if e.Current == nil {
		return fmt.Sprintf("persist: conflict: intent %s was not written, it is no longer stored", e.Key)
	}
	return fmt.Sprintf("persist: conflict: intent %s was not written, the store holds intent %s (seq %d, state %s)",
		e.Key, e.Current.Key, e.Current.Seq, e.Current.State)
}

// Claim writes rec as a new intent and the latest of its Name. It is
// s.Write with no old version. It fails if rec.Key is stored, or if a
// record of rec.Name has rec's Seq or a higher one. Its *ConflictError
// then holds the action's latest record. So two clients sharing the store
// never both make an intent for one action. Nor does one replace an
// intent the other is sending. They may be two parts of one app, each
// with its own idem.Client.
func Claim(ctx context.Context, s Store, rec *Record) error {
	return s.Write(ctx, rec, nil)
}

// SaveIf writes rec in s if the record stored with rec.Key is still
// old's version. It is s.Write with old, which must be of rec's own key.
// One client may take over an armed intent to send it. The client that
// armed it may replace it for a changed cart. They cannot both win.
func SaveIf(ctx context.Context, s Store, rec, old *Record) error {
	if err := checkOld(rec, old); err != nil {
		return err
	}
	return s.Write(ctx, rec, old)
}

// DeleteIf deletes old's record from s if it is still old's version. It
// is s.Delete. No record stored is not an error.
func DeleteIf(ctx context.Context, s Store, old *Record) error {
	if old == nil {
		return errors.New("persist: DeleteIf needs the version to delete")
	}
	return s.Delete(ctx, old)
}

// SaveDeferred is SaveIf, except that a store may make the write
// durable in the background (see WithDeferredSync). When it returns nil,
// the record reads back at once. It survives the kill of the process at
// once too. A power loss before its sync leaves the key's previous
// version, whole. rec must not be changed after the call.
func SaveDeferred(ctx context.Context, s Store, rec, old *Record) error {
	if err := checkOld(rec, old); err != nil {
		return err
	}
	return s.Write(WithDeferredSync(ctx), rec, old)
}

// checkOld reports an old version that cannot be the one rec replaces.
func checkOld(rec, old *Record) error {
	if old == nil || rec != nil && rec.Key != old.Key {
		return errors.New("persist: a change needs the version of rec's own key that rec replaces")
	}
	return nil
}

// deferredKey marks a context made by WithDeferredSync.
type deferredKey struct{}

// WithDeferredSync returns ctx marked for writes whose sync may come
// later. It is a hint about speed only, which a store may ignore. A
// FileStore then returns from Write once the record is written and can be
// read back. It makes the record durable in the background. Close waits
// for that. A power loss before then leaves the key's previous version,
// whole, never a damaged one. The caller also promises not to change the
// record after the call. So a memory store keeps it without copying its
// headers and bodies. A wrapper that overrides Write passes ctx on, and
// the hint with it.
func WithDeferredSync(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferredKey{}, true)
}

// DeferredSync reports whether ctx was made by WithDeferredSync. A Store
// of an app's own reads it to defer its sync. It does so where it can
// keep the promise WithDeferredSync describes.
func DeferredSync(ctx context.Context) bool {
	v, _ := ctx.Value(deferredKey{}).(bool)
	return v
}

// checkWrite reports why rec cannot be written over old, or nil. rec may
// be invalid, old of another key, or rec's version not new.
func checkWrite(rec, old *Record) error {
	if rec == nil {
		return errors.New("persist: cannot save a nil record")
	}
	if err := rec.Validate(); err != nil {
		return err
	}
	for _, t := range [2]time.Time{rec.CreatedAt, rec.UpdatedAt} {
		// Outside these years a time has no RFC 3339 form. So a file
		// store could not write it, and every store refuses it alike.
		if y := t.Year(); !t.IsZero() && (y < 0 || y > 9999) {
			return fmt.Errorf("persist: record %s has a time outside years 0-9999: %v", rec.Key, t)
		}
	}
	if rec.Rev == "" {
		return fmt.Errorf("persist: record %s has no version (Rev): set it to NewRev() before each write", rec.Key)
	}
	if old == nil {
		return nil
	}
	if old.Key != rec.Key {
		return fmt.Errorf("persist: cannot write intent %s over a version of intent %s", rec.Key, old.Key)
	}
	if old.Rev == rec.Rev {
		return fmt.Errorf("persist: intent %s is written with the version (Rev) it replaces: set it to NewRev() before each write", rec.Key)
	}
	return nil
}

// checkDelete reports why old cannot name a version to delete, or nil.
func checkDelete(old *Record) error {
	if old == nil {
		return errors.New("persist: Delete needs the version to delete")
	}
	if old.Rev == "" {
		return fmt.Errorf("persist: cannot delete intent %s without its version (Rev)", old.Key)
	}
	return nil
}

// writable returns nil if rec may be written over old. cur is the record
// stored with rec.Key, nil if none. named are the stored records of
// rec.Name, read only when old is nil and rec has a Name. A conflict
// returns a *ConflictError holding a copy of the record that refused it.
// A record that would change its Name gets another error.
func writable(rec, old, cur *Record, named []*Record) error {
	if old != nil {
		if cur == nil || old.Rev == "" || cur.Rev != old.Rev {
			return &ConflictError{Key: rec.Key, Current: cur.Clone()}
		}
		if cur.Name != rec.Name {
			// The file store files a record by its Name. A record
			// that changed it would need two files.
			return fmt.Errorf("persist: intent %s cannot move from action %q to %q: a record keeps its Name", rec.Key, cur.Name, rec.Name)
		}
		return nil
	}
	lost := cur != nil
	for _, r := range named {
		if r.Seq >= rec.Seq {
			lost = true
		}
	}
	if !lost {
		return nil
	}
	if cur != nil && (rec.Name == "" || cur.Name != rec.Name) {
		named = append(named, cur)
	}
	return &ConflictError{Key: rec.Key, Current: latest(named).Clone()}
}

// latest returns the intent created last among recs, the records of one
// Name. It has the highest Seq, which no setting of the device's clock
// moves. Records without one (0) come first, ordered by creation time.
// recs must not be empty.
func latest(recs []*Record) *Record {
	latest := recs[0]
	for _, r := range recs[1:] {
		if r.Seq > latest.Seq || r.Seq == latest.Seq && !r.CreatedAt.Before(latest.CreatedAt) {
			latest = r
		}
	}
	return latest
}

// deletable returns nil if old may be deleted, given cur, the record
// stored with its key. cur is nil if none is: that deletes nothing, and
// is no error. Otherwise deletable returns a *ConflictError holding a
// copy of cur.
func deletable(old, cur *Record) error {
	if cur != nil && cur.Rev != old.Rev {
		return &ConflictError{Key: old.Key, Current: cur.Clone()}
	}
	return nil
}
