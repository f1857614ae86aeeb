package idem

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemkit/idem/persist"
)

const (
	// tombstoneLifetime is how long Prune keeps the tombstone of an action's
	// latest resolved intent. It counts from the intent's outcome, by the
	// smallest age any clock reports.
	tombstoneLifetime = 90 * 24 * time.Hour
	// maxTombstones bounds the tombstones a store keeps. Beyond it, Prune
	// removes the oldest first. A tombstone holds no bodies and no request
	// headers, so it takes a few hundred bytes.
	maxTombstones = 4096
)

// Prune deletes from the store the resolved intents whose outcome is older
// than olderThan. It returns how many it deleted. Unresolved intents are
// never deleted, whatever their age.
//
// The age is the smallest any clock reports. One clock is the wall clock
// since the outcome was saved. Within the same boot, another is the clock
// that counts device sleep since then. (That is a Clock with SinceBoot, as
// the system clock has.) Say a payment was saved while the device's clock
// was days behind. Pruned after the clock was put right, it is judged by its
// true age. (That is so far as the device can tell.)
//
// Resolved stays resolved. What makes the next tap of a paid action a no-op
// is not deleted. Prune keeps a tombstone of each action's latest resolved
// intent, whatever its outcome. (See persist.Record.Tombstone.) The
// tombstone holds the key, action, request fingerprint and sequence number.
// It holds the outcome's status, stored Location and Content-Type, and the
// times. It holds no bodies.
//
// So Send or Intent for a paid action still pays nothing. It returns the
// answer (without a body), or a *ResolvedError. The same request of a
// declined action is still its declined intent, as before Prune. (NewIntent
// pays again.) An action's sequence numbers never go back. So an unarmed
// intent made before Prune never overtakes intents made after it.
//
// A tombstone is deleted once older than 90 days. Beyond 4096 tombstones,
// the oldest are deleted first. After that the action has no history on the
// device. An intent for it made before and armed after may then become its
// latest.
//
// Unreadable records are left alone and reported as List reports them.
func (c *Client) Prune(ctx context.Context, olderThan time.Duration) (int, error) {
	if olderThan < 0 {
		return 0, errors.New("idem: Prune with a negative age")
	}
	recs, listErr := c.store.List(ctx, persist.Filter{})
	var corrupt *persist.CorruptError
	if listErr != nil && !errors.As(listErr, &corrupt) {
		return 0, listErr
	}
	now := c.clocks.read()
	byName := make(map[string][]*persist.Record)
	for _, r := range recs {
		if r.Name != "" {
			byName[r.Name] = append(byName[r.Name], r)
		}
	}
	keep := make(map[string]bool) // keys of the actions' latest intents
	for _, rs := range byName {
		keep[latestOf(rs).Key] = true
	}

	drop := make(map[string]time.Time) // key: UpdatedAt when decided
	var tombs []*persist.Record
	var errs []error
	for _, r := range recs {
		if !r.State.Resolved() {
			continue
		}
		age := c.clocks.resolvedAge(r, now)
		switch {
		case keep[r.Key]:
			// The action's latest intent, whatever its outcome, keeps its
			// Seq in the store. An intent made for the action before this
			// Prune may wait unarmed in memory. Its Seq is above the kept
			// one, so it never overtakes one made after.
			if r.Tombstone && age >= tombstoneLifetime {
				drop[r.Key] = r.UpdatedAt
				continue
			}
			if !r.Tombstone && age >= olderThan {
				t := tombstone(r)
				t.Rev = c.revs.next()
				if err := persist.SaveIf(ctx, c.store, t, r); err != nil {
					errs = append(errs, &SaveError{Key: r.Key, Op: "keep tombstone", Err: err})
					continue
				}
				r = t
			}
			if r.Tombstone {
				tombs = append(tombs, r)
			}
		case age >= olderThan:
			drop[r.Key] = r.UpdatedAt
		}
	}
	if over := len(tombs) - maxTombstones; over > 0 {
		// The oldest go first, so they are sorted by smallest age, largest
		// first.
		ages := make(map[string]time.Duration, len(tombs))
		for _, t := range tombs {
			ages[t.Key] = c.clocks.resolvedAge(t, now)
		}
		for range over {
			oldest := 0
			for i, t := range tombs {
				if ages[t.Key] > ages[tombs[oldest].Key] {
					oldest = i
				}
			}
			drop[tombs[oldest].Key] = tombs[oldest].UpdatedAt
			tombs = append(tombs[:oldest], tombs[oldest+1:]...)
		}
	}
	n, err := persist.PruneFunc(ctx, c.store, func(r *persist.Record) bool {
		at, ok := drop[r.Key]
		return ok && at.Equal(r.UpdatedAt)
	})
	// PruneFunc reports the unreadable records List reported.
	return n, errors.Join(append(errs, err)...)
}

// tombstone returns what Prune keeps of a succeeded intent.
func tombstone(r *persist.Record) *persist.Record {
	t := *r
	t.Header, t.Body = nil, nil
	t.Tombstone = true
	if r.Response != nil {
		resp := *r.Response
		resp.Body = nil
		resp.Header = nil
		for _, name := range []string{"Location", "Content-Type"} {
			if v := r.Response.Header.Values(name); len(v) > 0 {
				if resp.Header == nil {
					resp.Header = http.Header{}
				}
				resp.Header[name] = append([]string(nil), v...)
			}
		}
		t.Response = &resp
	}
	return &t
}
