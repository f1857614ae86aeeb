package idem

import (
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/persist"
)

// keys is what this process knows about each key beyond what the store
// says: which intents it created and has not sent (the only ones known for
// certain never to have been sent), which it dropped unsent, which it has
// handed to Do, when it last sent each and when it first saw each, on the
// in-process timeline; and the version of each record it saved last.
// Safe for concurrent use.
type keys struct {
	mu sync.Mutex
	// unsent holds the keys this Client created and has not yet handed
	// to Do: the only intents known for certain never to have been sent.
	unsent map[string]struct{}
	// dropped holds the keys of unsent intents that Intent replaced; Do
	// refuses to send them.
	dropped map[string]struct{}
	// handed holds the keys this Client has handed to Do: a record read
	// as not sent may be older than such a Do (see dropUnsent).
	handed map[string]struct{}
	// lastSent holds, for the keys this Client sent and whose outcome is
	// unknown, when its last call of them ended; created, when it created
	// them or first judged their age; both on the in-process timeline
	// (clocks.sinceBirth).
	lastSent map[string]reading
	created  map[string]time.Duration

	// saved is the version of each unresolved record this Client saved
	// last.
	saved lastSaved
}

func newKeys() *keys {
	return &keys{
		unsent:   make(map[string]struct{}),
		lastSent: make(map[string]reading),
		created:  make(map[string]time.Duration),
	}
}

// bornAt returns when key was first seen on the in-process timeline,
// recording at as that time if it was not seen yet.
func (k *keys) bornAt(key string, at time.Duration) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	born, ok := k.created[key]
	if !ok {
		born = at
		k.created[key] = born
	}
	return born
}

// lastSaved remembers the version of each unresolved intent that this Client
// saved last, so that Do can tell an Intent that holds it from a stale one
// without reading the store. Resolved intents are dropped: they never
// change, so it holds only unresolved ones.
type lastSaved struct {
	mu sync.Mutex
	m  map[string]*persist.Record
}

func (l *lastSaved) saved(rec *persist.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec.State.Resolved() {
		delete(l.m, rec.Key)
		return
	}
	if l.m == nil {
		l.m = make(map[string]*persist.Record)
	}
	l.m[rec.Key] = rec
}

func (l *lastSaved) drop(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

func (l *lastSaved) is(rec *persist.Record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[rec.Key] == rec
}

// dropUnsent reports an intent that this Client created and has not handed
// to Do, and marks it dropped in the same step, so that a Do that starts
// meanwhile cannot send it: only then is "not sent" a fact rather than a
// guess. After a restart a new intent may have been sent (the first attempt
// is not recorded, to keep to one durable write per intent before Do
// returns).
//
// An intent stored as not sent (a call of it ended with ErrNotSent) is
// unsent too, unless this Client has sent it since: a Do that sends it
// again first stores it as new, and marks it handed (see markSent) before
// that, so the record read here may be older than the Do.
func (k *keys) dropUnsent(rec *persist.Record) bool {
	if rec.State != persist.StateNew && rec.State != persist.StateNotSent {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	_, unsent := k.unsent[rec.Key]
	if !unsent && rec.State == persist.StateNotSent {
		_, handed := k.handed[rec.Key]
		unsent = !handed
	}
	if !unsent {
		return false
	}
	delete(k.unsent, rec.Key)
	delete(k.created, rec.Key)
	delete(k.lastSent, rec.Key)
	if k.dropped == nil {
		k.dropped = make(map[string]struct{})
	}
	// Kept for the Client's life: an Intent value may still hold the
	// record, and a Do on it must not send it.
	k.dropped[rec.Key] = struct{}{}
	return true
}

// undropTaken reverts dropUnsent for a record another Client took over:
// it is no longer provably unsent.
func (k *keys) undropTaken(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.dropped, key)
	delete(k.unsent, key)
}

// undrop reverts dropUnsent when the record could not be deleted.
func (k *keys) undrop(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.dropped, key)
	k.unsent[key] = struct{}{}
}

func (k *keys) markCreated(key string, now time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unsent[key] = struct{}{}
	if _, ok := k.created[key]; !ok {
		k.created[key] = now
	}
}

// notReplaced returns an error matching ErrIntentReplaced if Intent has
// dropped key for a changed request.
func (k *keys) notReplaced(key string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.notReplacedLocked(key)
}

func (k *keys) notReplacedLocked(key string) error {
	if _, dropped := k.dropped[key]; dropped {
		return fmt.Errorf("%w; nothing was sent (key %s)", ErrIntentReplaced, key)
	}
	return nil
}

// markSent records that key is about to be sent, or refuses if Intent has
// dropped it for a changed request. unsent reports whether the key was
// provably unsent until now: this Client created it and has not sent it,
// or the store holds it as not sent (storedNotSent, read under the key's
// flight, so no other call of this process is sending it).
func (k *keys) markSent(key string, storedNotSent bool) (unsent bool, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.notReplacedLocked(key); err != nil {
		return false, err
	}
	// Once sent, the key is no longer provably unsent: forgetting it gives
	// the same answer from dropUnsent and keeps the map small.
	_, unsent = k.unsent[key]
	delete(k.unsent, key)
	if k.handed == nil {
		k.handed = make(map[string]struct{})
	}
	k.handed[key] = struct{}{}
	return unsent || storedNotSent, nil
}

// isUnsent reports whether this Client created key and has not sent it,
// or dropped it unsent.
func (k *keys) isUnsent(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, unsent := k.unsent[key]
	_, dropped := k.dropped[key]
	return unsent || dropped
}

// sent records that a call of key has just put its last attempt on the
// wire, or failed to: no attempt of this Client's can start after it.
func (k *keys) sent(key string, now reading) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lastSent[key] = now
}

// forget forgets what the Client tracks for a key whose outcome is known,
// or that was deleted.
func (k *keys) forget(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.lastSent, key)
	delete(k.created, key)
	delete(k.handed, key)
}

// mayStillArrive returns how much longer an attempt of key may still reach
// the server, as far as the device can know, or zero when none can. It
// must be called while no call of key runs in this process.
//
// An attempt may arrive up to the reconcile delay after it was last
// written, and it was last written no later than:
//
//   - never, if this Client created the intent and no attempt of it was
//     made (or every attempt provably never reached the server);
//   - the end of this Client's last call of key, if it made one;
//   - otherwise, the Client's birth: only an earlier process can have sent
//     it, and that process had ended.
//
// The time since then is the smallest any clock reports (the in-process
// timeline, which stops while the device sleeps; the wall clock, which the
// user may set back; the clock that counts sleep): no clock can make the
// wait shorter. Nothing of it needs to be stored.
func (k *keys) mayStillArrive(key string, now, birth reading, delay time.Duration) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, unsent := k.unsent[key]; unsent {
		return 0
	}
	last, ok := k.lastSent[key]
	if !ok {
		last = birth // the Client's birth
	}
	return max(delay-leastSince(last, now), 0)
}
