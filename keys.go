package idem

import (
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/persist"
)

// keys is what this process knows about each key beyond what the store
// says: its phase in the table of life.go, when it first saw it and when
// its last call ended, on the in-process timeline; and the version of
// each record it saved last. Every change of a phase is a step of that
// table. Safe for concurrent use.
type keys struct {
	mu    sync.Mutex
	lives map[string]*keyLife
	// spare holds entries of forgotten keys for reuse: a payment's entry
	// lives from its tap to its answer, and the next one takes it over,
	// which saves an allocation per payment.
	spare []*keyLife
	// tick counts the not-sent records this Client wrote: a call that
	// began before the one of its key never sends it (see begin).
	tick uint64

	// saved is the version of each unresolved record this Client saved
	// last.
	saved lastSaved
}

// maxSpareLives bounds the entries kept for reuse.
const maxSpareLives = 64

// keyLife is one key's entry.
type keyLife struct {
	phase phase
	// born is when the key was first seen on the in-process timeline
	// (clocks.sinceBirth), if hasBorn.
	born    time.Duration
	hasBorn bool
	// last is when its last call ended, if hasLast.
	last    reading
	hasLast bool
	// notSentAt is the tick of the not-sent record this Client wrote
	// last for it.
	notSentAt uint64
}

func newKeys() *keys {
	return &keys{lives: make(map[string]*keyLife)}
}

// lifeLocked returns key's entry, made in phaseStored if there is none.
func (k *keys) lifeLocked(key string) *keyLife {
	l := k.lives[key]
	if l == nil {
		if n := len(k.spare); n > 0 {
			l, k.spare = k.spare[n-1], k.spare[:n-1]
		} else {
			l = &keyLife{}
		}
		k.lives[key] = l
	}
	return l
}

// bornAt returns when key was first seen on the in-process timeline,
// recording at as that time if it was not seen yet.
func (k *keys) bornAt(key string, at time.Duration) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	if !l.hasBorn {
		l.born, l.hasBorn = at, true
	}
	return l.born
}

// lastSaved remembers the version of each unresolved intent that this
// Client saved last, so that Do can tell an Intent that holds it from a
// stale one without reading the store. Resolved intents are dropped: they
// never change, so it holds only unresolved ones.
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

// took reports whether rec is the version this Client saved last, and
// forgets it: the next call reads the store.
func (l *lastSaved) took(rec *persist.Record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	armed, ok := l.m[rec.Key]
	if ok {
		delete(l.m, rec.Key)
	}
	return ok && armed == rec
}

// phaseOfLocked reads the stored record rec through what this process
// knows of its key: the store is pessimistic, memory proves what it can.
//
//   - A record stored not sent is not-sent, unless a call of this Client
//     has sent it since (the record read may be older than the call).
//   - What this Client holds as provably unsent stays so only while the
//     store still holds it new or not sent: a record moved on (pending,
//     expired, taken over) may have been sent.
func (k *keys) phaseOfLocked(rec *persist.Record) phase {
	p := phaseStored
	if l := k.lives[rec.Key]; l != nil {
		p = l.phase
	}
	switch {
	case p == phaseDropped:
		return p
	case rec.State.Resolved():
		return phaseResolved
	case rec.HandedOut:
		return phaseHandedOut
	case p == phaseStored && rec.State == persist.StateNotSent:
		return phaseNotSent
	case (p == phaseArmed || p == phaseNotSent) && rec.State != persist.StateNew && rec.State != persist.StateNotSent:
		return phaseMaySent
	}
	return p
}

// replaceable reports whether Intent may replace rec, the action's latest
// intent as stored, for a changed request: only what was provably never
// sent (the table's evReplace). The caller runs it while no call of the
// key runs in this Client (flights.exclusive), and commits the drop with
// dropped once the store's conditional delete succeeded.
func (k *keys) replaceable(rec *persist.Record) bool {
	if rec.State != persist.StateNew && rec.State != persist.StateNotSent {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	_, v := step(k.phaseOfLocked(rec), evReplace)
	return v == vDrop
}

// reborn records that key's age starts again at now on the in-process
// timeline: it is sent again after it ended not sent.
func (k *keys) reborn(key string, now time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.born, l.hasBorn = now, true
}

// dropped records that key was replaced or forgotten: it is never sent.
// Kept for the Client's life: an Intent value may still hold the record,
// and a Do on it must not send it.
func (k *keys) dropped(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lives[key] = &keyLife{phase: phaseDropped}
}

// armed records that this Client armed key: its claim wrote the record,
// which proves that no record of the key was stored before (an earlier
// arming write that failed did not land). Provably unsent until a call of
// it writes.
func (k *keys) armed(key string, now time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.phase, _ = step(l.phase, evArm)
	if !l.hasBorn {
		l.born, l.hasBorn = now, true
	}
}

// notReplaced returns an error matching ErrIntentReplaced if key was
// dropped.
func (k *keys) notReplaced(key string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.notReplacedLocked(key)
}

func (k *keys) notReplacedLocked(key string) error {
	if l := k.lives[key]; l != nil && l.phase == phaseDropped {
		return fmt.Errorf("%w; nothing was sent (key %s)", ErrIntentReplaced, key)
	}
	return nil
}

// callTick returns the tick a call begins at (see begin).
func (k *keys) callTick() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tick
}

// begin is the table's evBegin (evBeginBackground for SettleAll) for rec,
// the stored version a call of this Client is about to send, under the
// key's flight. It returns whether no attempt of the intent can have
// reached the server before (vSendUnsent), or refuses: the key was
// replaced (ErrIntentReplaced), or the app was told it was not sent and
// has not asked again (a *notSentError). A call that began before this
// Client wrote the key's not-sent record (at tick) did not ask again: it
// is refused as SettleAll is.
func (k *keys) begin(rec *persist.Record, background bool, tick uint64) (unsent bool, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.phaseOfLocked(rec)
	e := evBegin
	if l := k.lives[rec.Key]; background || p == phaseNotSent && l != nil && l.notSentAt > tick {
		e = evBeginBackground
	}
	next, v := step(p, e)
	switch v {
	case vSend, vSendUnsent:
	case vRefuseNotSent:
		return false, &notSentError{Key: rec.Key, Err: errLeftUnsent}
	default:
		if err := k.notReplacedLocked(rec.Key); err != nil {
			return false, err
		}
		return false, fmt.Errorf("idem: intent %s may not be sent now (%s)", rec.Key, p)
	}
	k.lifeLocked(rec.Key).phase = next
	return v == vSendUnsent, nil
}

// ended is the end of a call of key without the server's word, at now:
// evWrote if an attempt of it may have written its request, then evEnded.
// It returns vNotSent when the call began provably unsent and wrote
// nothing: the caller makes the not-sent record durable, then calls
// notSent (or storeFailed if it could not), and only then tells "not
// sent". Otherwise vUnknown.
func (k *keys) ended(key string, wrote bool, now reading) verdict {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.last, l.hasLast = now, true
	if wrote {
		l.phase, _ = step(l.phase, evWrote)
	}
	next, v := step(l.phase, evEnded)
	if v != vNotSent {
		l.phase = next
	}
	return v
}

// tookOver is a call of key that took it over from another Client, which
// may have written its request: the table's evWrote.
func (k *keys) tookOver(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.phase, _ = step(l.phase, evWrote)
}

// noAttempt is the end of a call of key before any attempt began, at now.
func (k *keys) noAttempt(key string, now reading) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.last, l.hasLast = now, true
	l.phase, _ = step(l.phase, evNoAttempt)
}

// notSent commits a durable not-sent record of key.
func (k *keys) notSent(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	if next, v := step(l.phase, evEnded); v == vNotSent {
		k.tick++
		l.phase, l.notSentAt = next, k.tick
	}
}

// storeFailed is the table's evStoreFailed: the write the last step asked
// for failed, or its result is unknown.
func (k *keys) storeFailed(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.phase, _ = step(l.phase, evStoreFailed)
}

// handOut is the table's evHandOut for rec, the stored version about to
// be handed out: false if it was dropped.
func (k *keys) handOut(rec *persist.Record) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	next, v := step(k.phaseOfLocked(rec), evHandOut)
	if v != vHandOut {
		return false
	}
	k.lifeLocked(rec.Key).phase = next
	return true
}

// sendEnded is the table's evSendEnded: the app's send of a handed-out
// request ended at now.
func (k *keys) sendEnded(key string, now reading) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.phase, _ = step(phaseHandedOut, evSendEnded)
	l.last, l.hasLast = now, true
}

// isUnsent reports whether this Client armed key and has not sent it, or
// dropped it unsent.
func (k *keys) isUnsent(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lives[key]
	return l != nil && (l.phase == phaseArmed || l.phase == phaseDropped)
}

// forget forgets what the Client tracks for a key whose outcome is known,
// or that was deleted. A dropped key stays dropped.
func (k *keys) forget(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l := k.lives[key]; l != nil && l.phase != phaseDropped {
		delete(k.lives, key)
		if len(k.spare) < maxSpareLives {
			*l = keyLife{}
			k.spare = append(k.spare, l)
		}
	}
}

// tracked returns how many keys the Client holds an entry for.
func (k *keys) tracked() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.lives)
}

// mayStillArrive returns how much longer an attempt of key may still reach
// the server, as far as the device can know, or zero when none can. rec is
// the stored record, self this Client's holder id. It must be called while
// no call of key runs in this process.
//
// An attempt may arrive up to the reconcile delay after it was last
// written. Nothing can still arrive when the store says the intent was
// not sent, or when this Client armed it, holds it still, and no attempt
// of it was made (or every attempt provably never reached the server).
// Otherwise it was last written no later than:
//
//   - the end of this Client's last call of key, if it made one and
//     still holds the record: no other Client claimed it since;
//   - otherwise, the send deadline of the stored claim
//     (persist.Clocks.SendWall), and the Client's birth, whichever is
//     later: a Client claims the record (arms it, takes it over, sends
//     it again after not sent), with the latest time its call may begin
//     a send, before it sends it, and an expiry write moves nothing. A
//     holder's later call of a record it still holds writes no new
//     claim: its sends after the stored deadline are covered only by the
//     reconciling Client's birth.
//
// The wait is the longest of these. The time since each is the smallest
// any clock reports (the in-process timeline, which stops while the
// device sleeps; the wall clock, which the user may set back; the clock
// that counts sleep): no clock can make the wait shorter.
func (k *keys) mayStillArrive(key string, now, birth reading, delay time.Duration, rec *persist.Record, self string) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if rec.State == persist.StateNotSent {
		return 0
	}
	l := k.lives[key]
	if l != nil && rec.Holder == self {
		// This Client holds it: no other Client sent it since its claim,
		// and this Client knows when its own calls ended.
		if l.phase == phaseArmed || l.phase == phaseNotSent {
			return 0
		}
		if l.hasLast {
			return max(delay-leastSince(l.last, now), 0)
		}
	}
	wait := delay - leastSince(birth, now)
	if since, ok := sinceSendBy(rec.Clocks, now); ok {
		wait = max(wait, delay-since)
	}
	return max(wait, 0)
}
