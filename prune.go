package idem

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemkit/idem/persist"
)

const (
	// tombstoneLifetime is how long Prune keeps the tombstone of an
	// action's latest resolved intent, counted from its outcome by the
	// smallest age any clock reports.
	tombstoneLifetime = 90 * 24 * time.Hour
	// maxTombstones bounds the tombstones a store keeps; beyond it Prune
	// removes the oldest first. A tombstone holds no bodies and no request
	// headers: a few hundred bytes.
	maxTombstones = 4096
)

// Prune deletes from the store the resolved intents whose outcome is older
// than olderThan, and returns how many it deleted. Unresolved intents are
// never deleted, whatever their age.
//
// The age is the smallest any clock reports: the wall clock since the
// outcome was saved and, within the same boot, the clock that counts
// device sleep since then (a Clock with SinceBoot, as the system clock has). A payment saved while the
// device's clock was days behind, and pruned after the clock was put
// right, is judged by how long ago it really was, so far as the device can
// tell.
//
// Resolved stays resolved: what makes the next tap of a paid action a
// no-op is not deleted. Of each action's latest resolved intent, whatever
// its outcome, Prune keeps a tombstone (persist.Record.Tombstone: key,
// action, request fingerprint, sequence number, outcome status and the
// stored Location and Content-Type, times; no bodies). So Send or Intent
// for a paid action still returns its answer (without a body) or a
// *ResolvedError and pays nothing; the same request of a declined action
// is still its declined intent (NewIntent pays again), as before Prune;
// and an action's sequence numbers never go back, so an intent made
// before Prune, not yet armed, never overtakes the action's intents made
// after it. A tombstone is deleted once older than 90 days, or,
// beyond 4096 tombstones, oldest first; after that the action has no
// history on the device: an intent for it that was made before and is
// armed after may then be armed as the action's latest.
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
			// Seq in the store, so that an intent made for the action
			// before this Prune (its Seq above it, unarmed in memory) never
			// overtakes one made after.
			if r.Tombstone && age >= tombstoneLifetime {
				drop[r.Key] = r.UpdatedAt
				continue
			}
			if !r.Tombstone && age >= olderThan {
				t := tombstone(r)
				t.Rev = persist.NewRev()
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
		// The oldest go first: sorted by smallest age, largest first.
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
