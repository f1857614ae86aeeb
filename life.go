package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// The life of an intent, as this process knows it. Each key has one phase.
// Only the named events below move it, by one table. Every entry point asks
// the table what to do with a key. It may send it, tell "not sent", hand it
// out, say the outcome is unknown, or refuse. The entry point makes the record
// the table names durable before it acts on the answer.
//
// The store is pessimistic: an armed record may have been sent. Only this
// process's memory can prove an intent unsent. It can do so only while it
// holds the intent, from the arming write to the end of a call. None of that
// call's attempts may have written its request (httptrace's WroteHeaders). So
// the phases say what the process can prove. The store's state is read through
// them (see phaseOf).

// phase is what the process knows of one key.
type phase uint8

const (
	// phaseStored: nothing beyond what the store says. An armed record read so
	// may have been sent by an earlier process or another Client.
	phaseStored phase = iota
	// phaseUnarmed: made by Intent or NewIntent, in memory only, never sent.
	// The tap arms it.
	phaseUnarmed
	// phaseArmed: this Client armed it, or holds it again after "not sent". No
	// attempt of it can have been written since. So it is provably unsent,
	// though the store says it may have been sent.
	phaseArmed
	// phaseSending: a call of this Client holds it and has not ended. No
	// attempt before the call can have been written.
	phaseSending
	// phaseMaySent: an attempt may have reached the server. Its headers were
	// written, or no trace proves otherwise. The outcome is unknown until the
	// server's word.
	phaseMaySent
	// phaseNotSent: stored not sent, and the app was told so. Nothing sends it
	// until the app asks for it again.
	phaseNotSent
	// phaseHandedOut: HTTPRequest handed its request to the app, which may
	// send it at any time. It is never provably unsent again.
	phaseHandedOut
	// phaseDropped: replaced by a changed request, or forgotten, while
	// provably unsent. It is never sent.
	phaseDropped
	// phaseResolved: the server's word is stored. It is never sent again.
	phaseResolved
	nPhases
)

var phaseNames = [nPhases]string{"stored", "unarmed", "armed", "sending", "may-be-sent", "not-sent", "handed-out", "dropped", "resolved"}

func (p phase) String() string {
	if p < nPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", p)
}

// event is what happens to a key.
type event uint8

const (
	// evArm: the tap's arming write succeeded.
	evArm event = iota
	// evBegin: a call the app made for this intent is about to send it. Do,
	// Settle, Send and the RoundTripper make such calls.
	evBegin
	// evBeginBackground: SettleAll is about to send it. It never sends
	// what the app was told was not sent.
	evBeginBackground
	// evWrote: an attempt wrote its request (httptrace's WroteHeaders). Or it
	// ended without a trace that proves it did not.
	evWrote
	// evAnswer: the server's word arrived, a final answer or the lookup's.
	evAnswer
	// evEnded: a call ended without the server's word, after at least one
	// attempt began.
	evEnded
	// evNoAttempt: a call ended before any attempt began. Its context or
	// budget ended first.
	evNoAttempt
	// evHandOut: HTTPRequest is about to hand the request to the app.
	evHandOut
	// evSendEnded: the app reports that its send of a handed-out request
	// ended.
	evSendEnded
	// evReplace: Intent is about to replace it for a changed request.
	evReplace
	// evForget: Forget, or the one-call life of a RoundTripper key, ends.
	evForget
	// evStoreFailed: the write a transition asked for failed, or its result is
	// unknown.
	evStoreFailed
	nEvents
)

var eventNames = [nEvents]string{"arm", "begin", "begin-background", "wrote", "answer", "ended", "no-attempt", "hand-out", "send-ended", "replace", "forget", "store-failed"}

func (e event) String() string {
	if e < nEvents {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", e)
}

// verdict is what the caller is told to do, once the record of the next phase
// is durable.
type verdict uint8

const (
	// vKeep: nothing to do or tell.
	vKeep verdict = iota
	// vSend: send it. The outcome is not known yet.
	vSend
	// vSendUnsent: send it. No earlier attempt can have reached the server. So
	// a call that writes nothing may end "not sent".
	vSendUnsent
	// vNotSent: tell the app "not sent" (ErrNotSent). The record must say not
	// sent first. If that write fails, evStoreFailed follows.
	vNotSent
	// vRefuseNotSent: send nothing, and say it was not sent. The app was told
	// so and has not asked again.
	vRefuseNotSent
	// vUnknown: the outcome is unknown (ErrOutcomeUnknown).
	vUnknown
	// vHandOut: hand the request out, once it is stored as handed out.
	vHandOut
	// vDrop: drop it, by a conditional delete of the stored record.
	vDrop
	// vRefuse: refuse it. It may have reached the server (UnresolvedError). Or
	// it was replaced (ErrIntentReplaced).
	vRefuse
	// vResolved: record the server's word.
	vResolved
	nVerdicts
)

var verdictNames = [nVerdicts]string{"keep", "send", "send-unsent", "not-sent", "refuse-not-sent", "unknown", "hand-out", "drop", "refuse", "resolved"}

func (v verdict) String() string {
	if v < nVerdicts {
		return verdictNames[v]
	}
	return fmt.Sprintf("verdict(%d)", v)
}

// rule is one row of the table. In phase from, event on moves the key to phase
// to. The caller then does what verdict says.
type rule struct {
	from phase
	on   event
	to   phase
	do   verdict
}

// lifeRules is the table. A pair it does not name is refused. Such a pair
// leaves the phase as it is (see step).
var lifeRules = []rule{
	// The tap.
	{phaseUnarmed, evArm, phaseArmed, vKeep},
	// Unarmed intents live in the Intent until then. The arming write makes
	// the key's entry. The claim writes only where no record of the key is
	// stored. So it proves that an earlier arming write did not land, when
	// that write's result was unknown.
	{phaseStored, evArm, phaseArmed, vKeep},
	{phaseMaySent, evArm, phaseArmed, vKeep},
	{phaseDropped, evArm, phaseDropped, vRefuse},
	// A failed arming write may have armed it. From then on anyone who reads
	// the store may send it. So it is never provably unsent.
	{phaseUnarmed, evStoreFailed, phaseMaySent, vUnknown},

	// A call the app made. Only what this process armed and never wrote is
	// sent as provably unsent. So is what the store holds as not sent.
	{phaseArmed, evBegin, phaseSending, vSendUnsent},
	{phaseNotSent, evBegin, phaseSending, vSendUnsent},
	{phaseStored, evBegin, phaseMaySent, vSend},
	{phaseMaySent, evBegin, phaseMaySent, vSend},
	{phaseHandedOut, evBegin, phaseHandedOut, vSend},
	{phaseDropped, evBegin, phaseDropped, vRefuse},
	{phaseUnarmed, evBegin, phaseUnarmed, vRefuse},
	{phaseResolved, evBegin, phaseResolved, vResolved},

	// SettleAll acts as the app's call, but "not sent" is a promise.
	{phaseArmed, evBeginBackground, phaseSending, vSendUnsent},
	{phaseNotSent, evBeginBackground, phaseNotSent, vRefuseNotSent},
	{phaseStored, evBeginBackground, phaseMaySent, vSend},
	{phaseMaySent, evBeginBackground, phaseMaySent, vSend},
	{phaseHandedOut, evBeginBackground, phaseHandedOut, vSend},
	{phaseDropped, evBeginBackground, phaseDropped, vRefuse},
	{phaseUnarmed, evBeginBackground, phaseUnarmed, vRefuse},
	{phaseResolved, evBeginBackground, phaseResolved, vResolved},

	// Two calls at once under one key: neither is provably unsent. The
	// RoundTripper's calls that share a caller's key but not a request do so.
	{phaseSending, evBegin, phaseMaySent, vSend},
	{phaseSending, evBeginBackground, phaseMaySent, vSend},

	// An attempt wrote its request, as judged by WroteHeaders alone.
	{phaseSending, evWrote, phaseMaySent, vSend},
	{phaseMaySent, evWrote, phaseMaySent, vSend},
	{phaseHandedOut, evWrote, phaseHandedOut, vSend},

	// The call ended without the server's word. Only a call that began
	// provably unsent and wrote nothing ends "not sent".
	{phaseSending, evEnded, phaseNotSent, vNotSent},
	{phaseMaySent, evEnded, phaseMaySent, vUnknown},
	{phaseHandedOut, evEnded, phaseHandedOut, vUnknown},
	// No attempt began, so nothing changed.
	{phaseSending, evNoAttempt, phaseArmed, vUnknown},
	{phaseMaySent, evNoAttempt, phaseMaySent, vUnknown},
	{phaseHandedOut, evNoAttempt, phaseHandedOut, vUnknown},
	// The not-sent write failed, so it did not make the intent not sent. The
	// call says the outcome is unknown. Still, no attempt was written. So the
	// next call that writes nothing may still end not sent.
	{phaseSending, evStoreFailed, phaseArmed, vUnknown},
	{phaseNotSent, evStoreFailed, phaseMaySent, vUnknown},
	{phaseMaySent, evStoreFailed, phaseMaySent, vUnknown},
	{phaseArmed, evStoreFailed, phaseMaySent, vUnknown},
	{phaseStored, evStoreFailed, phaseMaySent, vUnknown},

	// The server's word, from any phase that may have sent it.
	{phaseStored, evAnswer, phaseResolved, vResolved},
	{phaseArmed, evAnswer, phaseResolved, vResolved},
	{phaseSending, evAnswer, phaseResolved, vResolved},
	{phaseMaySent, evAnswer, phaseResolved, vResolved},
	{phaseNotSent, evAnswer, phaseResolved, vResolved},
	{phaseHandedOut, evAnswer, phaseResolved, vResolved},
	{phaseResolved, evAnswer, phaseResolved, vResolved},

	// HTTPRequest: the app may send the request from the moment it is handed
	// out.
	{phaseArmed, evHandOut, phaseHandedOut, vHandOut},
	{phaseStored, evHandOut, phaseHandedOut, vHandOut},
	{phaseMaySent, evHandOut, phaseHandedOut, vHandOut},
	{phaseNotSent, evHandOut, phaseHandedOut, vHandOut},
	{phaseHandedOut, evHandOut, phaseHandedOut, vHandOut},
	{phaseDropped, evHandOut, phaseDropped, vRefuse},
	{phaseUnarmed, evHandOut, phaseUnarmed, vRefuse},
	// The app's send ended. The request may have arrived. But nothing of it is
	// still on its way after the reconcile delay.
	{phaseHandedOut, evSendEnded, phaseMaySent, vKeep},

	// A changed request replaces only what was provably never sent.
	{phaseUnarmed, evReplace, phaseDropped, vDrop},
	{phaseArmed, evReplace, phaseDropped, vDrop},
	{phaseNotSent, evReplace, phaseDropped, vDrop},
	{phaseStored, evReplace, phaseStored, vRefuse},
	{phaseSending, evReplace, phaseSending, vRefuse},
	{phaseMaySent, evReplace, phaseMaySent, vRefuse},
	{phaseHandedOut, evReplace, phaseHandedOut, vRefuse},
	{phaseResolved, evReplace, phaseResolved, vKeep},

	// Forget is the deliberate unsafe path, whatever the phase.
	{phaseStored, evForget, phaseDropped, vDrop},
	{phaseUnarmed, evForget, phaseDropped, vDrop},
	{phaseArmed, evForget, phaseDropped, vDrop},
	{phaseMaySent, evForget, phaseDropped, vDrop},
	{phaseNotSent, evForget, phaseDropped, vDrop},
	{phaseHandedOut, evForget, phaseDropped, vDrop},
	{phaseResolved, evForget, phaseDropped, vDrop},
	{phaseDropped, evForget, phaseDropped, vDrop},
}

// lifeTable is lifeRules indexed by phase and event, built once.
var lifeTable = func() (t [nPhases][nEvents]struct {
	to phase
	do verdict
	ok bool
}) {
	for _, r := range lifeRules {
		if t[r.from][r.on].ok {
			panic(fmt.Sprintf("idem: two rules for %s on %s", r.from, r.on))
		}
		t[r.from][r.on].to, t[r.from][r.on].do, t[r.from][r.on].ok = r.to, r.do, true
	}
	return t
}()

// step is the one transition. It returns the phase after e in p, and what the
// caller is told. A pair the table does not name is refused, and the phase
// stays.
func step(p phase, e event) (phase, verdict) {
	if p >= nPhases || e >= nEvents {
		return p, vRefuse
	}
	r := lifeTable[p][e]
	if !r.ok {
		return p, vRefuse
	}
	return r.to, r.do
}

// conflictMove is what a write of this Client does when the store refused
// it because the stored record is no longer the version it wrote from.
type conflictMove uint8

const (
	// cLanded: the stored record is this write. An earlier try landed, and its
	// result was lost.
	cLanded conflictMove = iota
	// cAdopt: the stored record is resolved, since another Client or call got
	// the server's word. It is never overwritten. The caller takes it for the
	// intent's and tells it.
	cAdopt
	// cYield: another Client holds the stored record now. It took the intent
	// over, may be sending it, or stored it not sent. What this Client knows
	// short of the server's answer never overwrites it. That covers attempts,
	// expiry and a void. The write fails.
	cYield
	// cOver: the write goes on from the stored record. That record is this
	// Client's own later version, or it was forgotten. Or the write is the
	// server's answer, which settles any unresolved record.
	cOver
	// cRefused: the write fails. The store refused for another key, since the
	// action has a later intent. Or a first write found a record.
	cRefused
	// cDisputed: the write is an answer the Client took for the server's,
	// and the stored record another Client's void. One of the two is wrong.
	// A front may have copied the key into its own answer. Or the request
	// was held on its way past the reconcile delay, and the void came from
	// a miss before it landed. The server's lookup decides (arbitrate).
	cDisputed
)

// afterConflict decides what follows a conflict. stored is the record the
// store holds now, or nil if none. rec is the refused write. prev is the
// version it was written from. self is the writing Client's holder id.
// The server's final answer in hand wins over a stored void. A stored
// answer (succeeded or failed) wins over it, for that is the server's word
// too.
func afterConflict(stored, rec, prev *persist.Record, self string) conflictMove {
	switch {
	case persist.SameVersion(stored, rec):
		return cLanded
	case stored != nil && stored.Key != rec.Key, stored == nil && prev == nil:
		return cRefused
	case stored == nil:
		return cOver
	case stored.State == persist.StateVoid && answered(rec):
		return cDisputed
	case stored.State.Resolved():
		return cAdopt
	case stored.Holder != self && !answered(rec):
		return cYield
	}
	return cOver
}

// The clock readings a write stores with a record (persist.Clocks) are part of
// the step. Each step is given one reading of the device's clocks
// (clocks.read) and the wall clock's high-water mark. It sets them in the
// record it makes.

// stamped sets in cl the readings r and the high-water mark of a write of rec,
// over what rec held. It makes rec hold cl. armed is set for the arming write.
// cl is memory made with rec's version, or new.
func stamped(rec *persist.Record, cl *persist.Clocks, r reading, mark time.Time, armed bool) {
	if rec.Clocks != nil {
		*cl = *rec.Clocks
	} else {
		*cl = persist.Clocks{}
	}
	// The marks are kept in UTC, the form a store keeps. So a store need
	// not copy the readings to convert them (persist's prepareShared).
	mark = mark.UTC()
	cl.WriteBoot, cl.Written = r.bootID, r.boot
	cl.Mark = mark
	if armed {
		cl.ArmBoot, cl.Armed, cl.ArmMark = r.bootID, r.boot, mark
	}
	rec.Clocks = cl
}

// nextVersion is the version of a record a call makes. It has room for what
// its last write adds: the clock readings and the server's answer. One
// allocation serves the three. Each room is used by one write only.
type nextVersion struct {
	rec    persist.Record
	clocks persist.Clocks
	answer persist.Response
}

// sendBy sets in cl the latest time a call that begins at r may begin a send.
// That is d, its budget, later. It is set on the wall clock and on the clock
// that counts sleep. The wall clock is read no earlier than mark, its
// high-water mark. So a clock set back cannot make the deadline early. sendBy
// never makes the deadline cl holds earlier. Another Client's call may still
// be sending under it.
func sendBy(cl *persist.Clocks, r reading, mark time.Time, d time.Duration) {
	wall := r.wall
	if mark.After(wall) {
		wall = mark
	}
	if at := wall.Add(d); at.After(cl.SendWall) {
		cl.SendWall = at
	}
	if by := r.boot + d; cl.SendBoot != r.bootID || by > cl.SendBy {
		cl.SendBoot, cl.SendBy = r.bootID, by
	}
}

// sendSlack is how long after a write of a send deadline its call may begin
// and still send under it. A call begins at once after the write. The tap's
// call begins after its arming write. So the tap's path has one durable write.
const sendSlack = 5 * time.Second

// sendByLeft returns the least time any clock says is left until the send
// deadline stored in cl. It returns 0 when cl stores none. The wall clock is
// read no earlier than mark, its high-water mark. So a clock set back cannot
// make the deadline look far.
func sendByLeft(cl *persist.Clocks, now reading, mark time.Time) time.Duration {
	if cl == nil || cl.SendWall.IsZero() {
		return 0
	}
	wall := now.wall
	if mark.After(wall) {
		wall = mark
	}
	left := cl.SendWall.Sub(wall)
	if cl.SendBoot != "" && cl.SendBoot == now.bootID {
		left = min(left, cl.SendBy-now.boot)
	}
	return left
}

// sinceSendBy returns the smallest time any clock says passed from the
// send deadline stored in cl to now, and false when cl stores none.
func sinceSendBy(cl *persist.Clocks, now reading) (time.Duration, bool) {
	if cl == nil || cl.SendWall.IsZero() {
		return 0, false
	}
	d := now.wall.Sub(cl.SendWall)
	if cl.SendBoot != "" && cl.SendBoot == now.bootID {
		d = min(d, now.boot-cl.SendBy)
	}
	return d, true
}

// The life of a key in this process. keys holds what the process knows of each
// key beyond what the store says, such as its phase in the table above. The
// steps of a call on the key's record move both together. They are
// currentVersion, hold, recordNoAnswer, recordNotSent, recordAnswer and
// recordExpiry. The store's conditional write (saveWith) makes each durable
// before the call acts on it. Client.doAs (do.go) takes a call through them,
// and call.go makes its attempts.

// keys is what this process knows about each key beyond what the store says.
// It holds the key's phase in the table above. It holds when it first saw the
// key and when its last call ended, on the in-process timeline. It holds the
// version of each record it saved last. Every change of a phase is a step of
// that table. keys is safe for concurrent use.
type keys struct {
	mu    sync.Mutex
	lives map[string]*keyLife
	// self is the Client's holder id (persist.Record.Holder).
	self string
	// spare holds entries of forgotten keys for reuse. A payment's entry lives
	// from its tap to its answer, and the next one takes it over. That saves
	// an allocation per payment.
	spare []*keyLife
	// tick counts the not-sent records this Client wrote. A call that began
	// before the one of its key never sends it (see begin).
	tick uint64

	// saved is the version of each unresolved record this Client saved
	// last.
	saved lastSaved

	// overruled holds, by key, what the server's word made of an intent
	// that the store still holds void. The write over the void failed
	// (arbitrate, recordLookup). This Client never reads that void: its
	// store's view writes the record over it (overrulingStore). A restart
	// forgets it. It holds at most maxOverruled keys. nOverruled counts
	// them, so a read need not lock to learn there are none.
	overruled  map[string]*persist.Record
	nOverruled atomic.Int32
}

// maxOverruled bounds the voids a Client remembers as overruled. Each needs
// a failed write after a dispute, so few ever exist.
const maxOverruled = 1024

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
	// others is set when this Client took the record over from another Client.
	// That Client's call may still be sending it.
	others bool
	// notSentAt is the tick of the not-sent record this Client wrote
	// last for it.
	notSentAt uint64
}

func newKeys(self string) *keys {
	return &keys{lives: make(map[string]*keyLife), self: self}
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

// bornAt returns when key was first seen on the in-process timeline. If it was
// not seen yet, it records at as that time.
func (k *keys) bornAt(key string, at time.Duration) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	if !l.hasBorn {
		l.born, l.hasBorn = at, true
	}
	return l.born
}

// lastSaved remembers the version of each unresolved intent that this Client
// saved last. So Do can tell an Intent that holds it from a stale one without
// reading the store. Resolved intents never change, so it drops them.
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

// took reports whether rec is the version this Client saved last, and forgets
// it. The next call reads the store.
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
// knows of its key. The store is pessimistic, and memory proves what it
// can:
//
//   - A record stored not sent is not-sent, unless a call of this Client
//     has sent it since. The record read may be older than the call.
//   - What this Client holds as provably unsent stays so only while the
//     store still holds it new or not sent. A record moved on (pending,
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
	case (p == phaseArmed || p == phaseNotSent || p == phaseSending) && rec.Holder != "" && rec.Holder != k.self:
		// Another Client holds the record. It may have armed the intent again
		// and sent it. This Client's proof covers only its own calls.
		if rec.State == persist.StateNotSent {
			return phaseNotSent
		}
		return phaseMaySent
	}
	return p
}

// replaceable reports whether Intent may replace rec for a changed request.
// rec is the action's latest intent as stored. Only what was provably never
// sent may be replaced (the table's evReplace). The caller runs it while no
// call of the key runs in this Client (flights.exclusive). It commits the drop
// with dropped once the store's conditional delete succeeded.
func (k *keys) replaceable(rec *persist.Record) bool {
	if rec.State != persist.StateNew && rec.State != persist.StateNotSent {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	_, v := step(k.phaseOfLocked(rec), evReplace)
	return v == vDrop
}

// reborn records that key's age starts again at now, on the in-process
// timeline. It is sent again after it ended not sent.
func (k *keys) reborn(key string, now time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.born, l.hasBorn = now, true
}

// dropped records that key was replaced or forgotten, so it is never sent. It
// is kept for the Client's life. An Intent value may still hold the record,
// and a Do on it must not send it.
func (k *keys) dropped(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lives[key] = &keyLife{phase: phaseDropped}
}

// armed records that this Client armed key. Its claim wrote the record. That
// proves no record of the key was stored before. So an earlier arming write
// that failed did not land. The key is provably unsent until a call of it
// writes.
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

// begin is the table's evBegin for rec, or evBeginBackground for SettleAll.
// rec is the stored version a call of this Client is about to send, under the
// key's flight. begin returns whether no attempt of the intent can have
// reached the server before (vSendUnsent). Or it refuses. The key may have
// been replaced (ErrIntentReplaced). Or the app was told it was not sent and
// has not asked again (a *notSentError). A call may have begun before this
// Client wrote the key's not-sent record (at tick). That call did not ask
// again, so it is refused as SettleAll is.
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

// ended is the end of a call of key without the server's word, at now. It is
// evWrote if an attempt of it may have written its request, then evEnded. It
// returns vNotSent when the call began provably unsent and wrote nothing. The
// caller then makes the not-sent record durable. Then it calls notSent, or
// storeFailed if it could not. Only then does it tell "not sent". Otherwise
// ended returns vUnknown.
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

// tookOver is a call of key that took it over from another Client, the table's
// evWrote. The other Client may have written its request.
func (k *keys) tookOver(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.phase, _ = step(l.phase, evWrote)
}

// claimedFrom records that this Client took key's record over from
// another Client (see mayStillArrive).
func (k *keys) claimedFrom(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lifeLocked(key).others = true
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

// storeFailed is the table's evStoreFailed. The write the last step asked for
// failed, or its result is unknown.
func (k *keys) storeFailed(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.lifeLocked(key)
	l.phase, _ = step(l.phase, evStoreFailed)
}

// handOut is the table's evHandOut for rec, the stored version about to be
// handed out. It returns false if rec was dropped.
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

// sendEnded is the table's evSendEnded. The app's send of a handed-out request
// ended at now.
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

// forget forgets what the Client tracks for a key whose outcome is known, or
// that was deleted. A dropped key stays dropped.
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

// overrule remembers rec, the server's word on an intent, when the store
// could not write it over a void (see keys.overruled).
func (k *keys) overrule(rec *persist.Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.overruled == nil {
		k.overruled = make(map[string]*persist.Record)
	}
	if _, ok := k.overruled[rec.Key]; ok || len(k.overruled) < maxOverruled {
		k.overruled[rec.Key] = rec
		k.nOverruled.Store(int32(len(k.overruled)))
	}
}

// anyOverruled reports whether the Client holds any overruled void.
func (k *keys) anyOverruled() bool { return k.nOverruled.Load() > 0 }

// overruledKeys returns the keys of the overruled voids.
func (k *keys) overruledKeys() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Collect(maps.Keys(k.overruled))
}

// overruling returns what overrules key's stored void, or nil.
func (k *keys) overruling(key string) *persist.Record {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.overruled[key]
}

// upheld forgets key's overruled void, once the store holds the word that
// overruled it.
func (k *keys) upheld(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.overruled, key)
	k.nOverruled.Store(int32(len(k.overruled)))
}

// tracked returns how many keys the Client holds an entry for.
func (k *keys) tracked() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.lives)
}

// mayStillArrive returns how much longer an attempt of key may still reach
// the server, as far as the device can know. It returns zero when none
// can. rec is the stored record, and self this Client's holder id. It must
// be called while no call of key runs in this process.
//
// An attempt may arrive up to the reconcile delay after it was last
// written. Nothing can still arrive when the store says the intent was not
// sent. Nor can it when this Client armed it, holds it still, and made no
// attempt of it. Attempts that provably never reached the server count as
// none. Otherwise the last write was no later than one of these:
//
//   - The end of this Client's last call of key. That holds if it made
//     one, still holds the record, did not take it over from another
//     Client, and has not handed its request to the app. Then no other
//     Client claimed it since.
//   - Otherwise, the later of the stored claim's send deadline
//     (persist.Clocks.SendWall) and the Client's birth. A Client claims
//     the record before it sends it: it arms it, takes it over, sends it
//     again after not sent, or resumes it past the stored deadline. The
//     claim holds the latest time its call may begin a send. No call
//     begins a send past it (sendDeadline). A hand-out claims it up to the
//     server's retention from then, as the app may send its request at any
//     time. SendEnded claims it up to the end of the app's send.
//
// The wait is the longest of these. The time since each is the smallest that
// three clocks report. They are the in-process timeline, the wall clock and
// the clock that counts sleep. The first stops while the device sleeps, and
// the user may set the second back. So no clock can make the wait shorter.
func (k *keys) mayStillArrive(key string, now, birth reading, delay time.Duration, rec *persist.Record, self string) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if rec.State == persist.StateNotSent {
		return 0
	}
	l := k.lives[key]
	if l != nil && rec.Holder == self {
		// This Client holds it. No other Client sent it since its claim, and
		// this Client knows when its own calls ended.
		if l.phase == phaseArmed || l.phase == phaseNotSent {
			return 0
		}
		if l.hasLast && l.phase != phaseHandedOut && !l.others {
			return max(delay-leastSince(l.last, now), 0)
		}
	}
	wait := delay - leastSince(birth, now)
	if since, ok := sinceSendBy(rec.Clocks, now); ok {
		if now.bootID == "" {
			// No clock counts sleep. What the wall clock moved since this
			// Client's birth beyond its in-process timeline is not time that
			// passed. A clock set forward moves it so.
			since -= max(now.wall.Sub(birth.wall)-(now.in-birth.in), 0)
		}
		wait = max(wait, delay-since)
	}
	return max(wait, 0)
}

// life is what the durable steps of an intent's life need. It holds what
// this process knows of its keys, the device's clocks, and the holder id.
// It holds the settings the steps read, too. The Client embeds it, so the
// steps are the Client's own methods.
type life struct {
	keys   *keys   // what this process knows about each key
	clocks *clocks // the device's clocks, to judge an intent's age

	// id names this Client in the records it arms or takes over
	// (persist.Record.Holder). It is random, so that each Client is another
	// holder. That holds for Clients in this process or a later one.
	id string
	// revs makes the versions this Client writes.
	revs *revs

	// set is the part of the Client's settings that the steps read. It
	// points to their one home, in the Client's settings.
	set *lifeConfig
}

// revs makes the versions a Client writes (persist.Record.Rev). Each is a
// prefix drawn at random once per Client, and a count. So each is unique, as
// a random version per write (persist.NewRev) is. But a write draws nothing
// from the system's random source. That cost a payment about a microsecond
// for its two writes.
type revs struct {
	prefix string
	n      atomic.Uint64
}

func newRevs() *revs { return &revs{prefix: persist.NewRev() + "."} }

// next returns a version no writer has used.
func (r *revs) next() string {
	var b [16]byte
	return r.prefix + string(strconv.AppendUint(b[:0], r.n.Add(1), 36))
}

// currentVersion returns the version of in's record to send from. It reports
// whether that is the version this Client saved last.
func (c *life) currentVersion(ctx context.Context, in *Intent) (cur *persist.Record, known bool, err error) {
	cur = in.current()
	// Intent deleted a replaced intent from the store. Say so, rather than
	// that the store has no such intent.
	if err := c.keys.notReplaced(cur.Key); err != nil {
		return nil, false, err
	}
	// The store is the truth. Another Intent value for this key may have moved
	// an unresolved intent on. So may another Client on the store, or an
	// earlier process. A resolved intent never changes, so it needs no read.
	// A void is the exception: the server's word that it was done is written
	// over it (arbitrate, recordLookup). Nor does an intent need a read that
	// holds the version this Client saved last, since it is
	// current. But a version that reads provably unsent is trusted only by the
	// call that follows its arming. Another Client may have taken it over and
	// sent it since. An intent stored not sent is always read.
	switch cur.State {
	case persist.StateNew:
		known = c.keys.saved.took(cur)
	case persist.StateNotSent:
		known = false
	default:
		known = c.keys.saved.is(cur)
	}
	// So is an intent whose void this Client knows the server overruled
	// (overrulingStore): the read writes the server's word over the void.
	if !in.ephemeral && (!cur.State.Resolved() || cur.State == persist.StateVoid || c.keys.anyOverruled()) && !known {
		stored, err := c.set.store.Get(ctx, cur.Key)
		if err != nil {
			return nil, false, unread(cur, err)
		}
		in.set(stored)
		return stored, false, nil
	}
	return cur, known, nil
}

// unread is the error of a call that could not read in's record, and sent
// nothing. cur is the version that in holds. The error is err, the store's, or
// the context's error when it ended. It also matches ErrOutcomeUnknown when
// cur says an earlier attempt may have reached the server. That is any
// unresolved state but StateNotSent. An armed intent may have been sent by a
// process that died before it recorded the attempt. A record stored not sent
// claims neither an unknown outcome nor ErrNotSent. The store, unread, may no
// longer say so.
func unread(cur *persist.Record, err error) error {
	if cur.State == persist.StateNotSent {
		return fmt.Errorf("idem: loading intent %s: %w", cur.Key, err)
	}
	return fmt.Errorf("idem: loading intent %s: %w; %w", cur.Key, err, ErrOutcomeUnknown)
}

// recordExpiry ends a call of an intent too old to send. Its outcome is
// unknown, and it is stored as expired, even if ctx is done. A call whose
// context ended before it began is still told the intent expired. It is not
// told that the context ended it. The app settles it through the lookup.
func (c *life) recordExpiry(ctx context.Context, in *Intent, rec *persist.Record) error {
	err := &RetryError{Key: rec.Key, Reason: stopExpired}
	c.logUnknown(ctx, rec, err)
	if rec.State != persist.StateExpired {
		rec.State = persist.StateExpired
		rec.UpdatedAt = c.set.clock.Now()
		if saveErr := c.save(detached(ctx), in, rec, "record expiry"); saveErr != nil {
			return errors.Join(err, saveErr)
		}
	}
	return err
}

// sendable refuses a record that no attempt could send, with a *notSentError.
// Such a record was damaged or edited on the device. It refuses it before it
// is marked sent. checked says the record is the version this Client validated
// and saved last, and not as expired. A clock set back can make an expired
// version sendable again.
func (c *life) sendable(rec *persist.Record, checked bool) error {
	if !checked {
		if err := (Request{Method: rec.Method, URL: rec.URL}).validate(); err != nil {
			return &notSentError{Key: rec.Key, Err: err}
		}
	}
	if !spells(rec.KeyHeader, rec.Key) {
		return &notSentError{Key: rec.Key, Err: fmt.Errorf("idem: the stored Idempotency-Key value %q does not spell the key", rec.KeyHeader)}
	}
	return nil
}

// bornAgain starts the age of rec, stored not sent, again as it is sent again
// or handed out. No send of it ever began. So the server's retention of its
// key starts no sooner than this one, as at the tap. Its age on every clock,
// and on the in-process timeline, counts from now.
func (c *life) bornAgain(rec *persist.Record) {
	rec.CreatedAt = c.set.clock.Now()
	c.keys.reborn(rec.Key, c.clocks.sinceBirth())
	c.stamp(rec, new(persist.Clocks), true)
}

// stamp reads the device's clocks once. It stores the readings of a write of
// rec in cl, which rec holds from then on (stamped). It returns the reading.
func (c *life) stamp(rec *persist.Record, cl *persist.Clocks, armed bool) reading {
	r := c.clocks.read()
	stamped(rec, cl, r, c.clocks.mark(r), armed)
	return r
}

// mustHold reports whether a call must hold rec (hold) before it sends it. It
// must when rec is sent again after it ended not sent. It must when a Client
// that does not hold rec resumes it. And it must when its holder resumes it
// and the stored send deadline ends before this call's budget could. now is
// a reading of the clocks taken now.
func (c *life) mustHold(ctx context.Context, rec *persist.Record, now reading) bool {
	return rec.State == persist.StateNotSent || rec.Holder != c.id ||
		c.sendLeft(rec, now) < c.set.maxElapsed(ctx)
}

// sendLeft returns the least time any clock says is left until the send
// deadline rec stores (sendByLeft), on the reading now.
func (c *life) sendLeft(rec *persist.Record, now reading) time.Duration {
	return sendByLeft(rec.Clocks, now, c.clocks.mark(now))
}

// claim gives rec clocks of its own. They say the latest time a call that
// begins now may begin a send, d later (sendBy). claim returns the reading of
// now. With over set, the deadline rec held is dropped first. So the new one
// may be earlier.
func (c *life) claim(rec *persist.Record, d time.Duration, over bool) reading {
	cl := new(persist.Clocks)
	if rec.Clocks != nil {
		*cl = *rec.Clocks
	}
	if over {
		cl.SendWall, cl.SendBoot, cl.SendBy = time.Time{}, "", 0
	}
	r := c.clocks.read()
	sendBy(cl, r, c.clocks.mark(r), d)
	rec.Clocks = cl
	return r
}

// hold makes this Client the holder of rec before it sends it. It does so when
// rec is sent again after it ended not sent. It does so when a Client that did
// not arm rec resumes it. And it does so when its holder resumes it past the
// send deadline its last write stored. hold returns the version to send. Or it
// returns moved, when another Client moved the record on since cur was read.
// The call then goes on from what is stored, which in holds. unsent says the
// call began provably unsent. A take-over ends that (keys.tookOver).
//
// A record sent again, as the app asked, may reach the server from the first
// byte on. So the store must stop saying it was not sent before then. Else a
// crash during the send would leave it replaceable. A Client that did not arm
// the record may resume it. That is another Client on the store, or a later
// process. It takes the record over first. Then the Client that armed it can
// no longer take it for unsent and replace it. Either is one step with the
// store, made only if the record is still the version read (persist.SaveIf).
// That is one extra write on resumes only, never on the tap's path. The claim
// says the latest time its holder's call may begin a send. Any other Client's
// reconcile delay counts from it. So a holder that resumes past that time
// writes a later one first. If it dies while its request is in transit,
// another Client's lookup still waits for the request.
func (c *life) hold(ctx context.Context, in *Intent, rec, cur *persist.Record, unsent bool) (held *persist.Record, moved bool, err error) {
	takeOver := rec.Holder != c.id
	wasUnsent := unsent
	if takeOver && rec.State != persist.StateNotSent {
		// The Client that armed it may be sending it. So no trace of this
		// Client's attempts can tell it unsent.
		unsent = false
	}
	op := "send again"
	switch {
	case takeOver:
		op = "take over"
	case rec.State != persist.StateNotSent:
		op = "resume"
	}
	if rec.State == persist.StateNotSent {
		rec.State = persist.StateNew
		c.bornAgain(rec)
	}
	rec.Holder = c.id
	rec.UpdatedAt = c.set.clock.Now()
	// The claim carries the latest time this call may begin a send.
	c.claim(rec, c.set.maxElapsed(ctx)+sendSlack, false)
	if err := c.saveIf(ctx, in, rec, cur, op); err != nil {
		var changed *persist.ConflictError
		if errors.As(err, &changed) {
			if changed.Current == nil {
				// Another Client replaced it for a changed request.
				c.keys.dropped(rec.Key)
				return nil, false, fmt.Errorf("%w; nothing was sent (key %s)", ErrIntentReplaced, rec.Key)
			}
			in.set(changed.Current)
			c.keys.saved.drop(rec.Key)
			return nil, true, nil
		}
		// Nothing of this call was sent. The write's result is unknown, and
		// the next call reads what the store holds. The write may have landed.
		// Then the intent is armed again, and a later start may send it. So
		// the error says the outcome is unknown. A changed cart's delete is
		// conditional on the version read, so it fails if the write landed.
		c.keys.noAttempt(rec.Key, c.clocks.read())
		var se *SaveError
		if errors.As(err, &se) {
			se.mayHaveLanded = true
		}
		return nil, false, err
	}
	if wasUnsent && !unsent {
		// Taken over from another Client, which may be sending it. So this
		// call can no longer end "not sent".
		c.keys.tookOver(rec.Key)
	}
	if takeOver {
		// The Client it was taken from may still be sending it. So this
		// Client's own calls no longer tell when the last send began.
		c.keys.claimedFrom(rec.Key)
	}
	again := *rec
	return &again, false, nil
}

// recordNoAnswer records a call that ended without a final answer, and returns
// its error. That is a *notSentError when nothing can have reached the server.
// Else it is retryErr, and the outcome is unknown.
//
// "Not sent" is judged by the transport's trace alone (WroteHeaders), never by
// the final error. net/http resends a request that carries an Idempotency-Key
// on a new connection. So a dial error can follow bytes written earlier.
func (c *life) recordNoAnswer(ctx context.Context, in *Intent, rec *persist.Record, retryErr *RetryError) error {
	now := c.set.clock.Now()
	// The call made one attempt, which failed for good and never reached
	// the server.
	oneNeverReached := retryErr.Reason == stopFatal && retryErr.Attempts == 1 && retryErr.unreached
	if retryErr.Attempts == 0 {
		c.keys.noAttempt(rec.Key, c.clocks.read())
	} else if c.keys.ended(rec.Key, !retryErr.noneWritten, c.clocks.read()) == vNotSent {
		return c.recordNotSent(ctx, in, rec, retryErr, now)
	}
	c.logUnknown(ctx, rec, retryErr)
	if oneNeverReached {
		// The one attempt never reached the server, but an earlier one may
		// have. There is nothing to record.
		return retryErr
	}
	rec.Attempts += retryErr.Attempts
	rec.Redirected = rec.Redirected || retryErr.afterRedirect
	rec.UpdatedAt = now
	if retryErr.Reason == stopExpired {
		rec.State = persist.StateExpired
	} else if retryErr.Attempts > 0 {
		rec.State = persist.StatePending
	}
	// The save records what is known. If it fails, the intent stays unresolved
	// in the store anyway, which is the safe side.
	if retryErr.Attempts > 0 || retryErr.Reason == stopExpired {
		if saveErr := c.save(detached(ctx), in, rec, "record attempts"); saveErr != nil {
			return errors.Join(retryErr, saveErr)
		}
	}
	return retryErr
}

// recordNotSent records a call none of whose attempts wrote its request, as
// the transport's trace shows. The network was down, the host unknown, or the
// connection or the certificate refused. No attempt before the call can have
// sent the intent. So the intent stays provably unsent, and Intent may replace
// it. The store says so too. So after a restart SettleAll does not send what
// the app was told was not sent.
//
// The app is told "not sent" only once the store says so. A not-sent write may
// fail, or its result may be unknown. Then it did not make the intent not
// sent. The call ends with the outcome unknown (retryErr, with the store's
// error).
func (c *life) recordNotSent(ctx context.Context, in *Intent, rec *persist.Record, retryErr *RetryError, now time.Time) error {
	err := &notSentError{Key: rec.Key, Err: retryErr.Err, Attempts: retryErr.Attempts, Reason: retryErr.Reason}
	if err.Err == nil || retryErr.stopped {
		err.Err = errors.New("idem: no attempt wrote the request")
	}
	if rec.State == persist.StateNotSent || in.ephemeral {
		c.logNotSent(ctx, rec, err)
		c.keys.notSent(rec.Key)
		return err
	}
	// Only if no other Client took it over since this call began. One that did
	// may have sent it.
	prev := in.current()
	rec.State = persist.StateNotSent
	rec.UpdatedAt = now
	if saveErr := c.saveIf(detached(ctx), in, rec, prev, "record not sent"); saveErr != nil {
		c.logUnknown(ctx, rec, retryErr)
		c.keys.storeFailed(rec.Key)
		if errors.As(saveErr, new(*persist.ConflictError)) {
			return retryErr
		}
		return errors.Join(retryErr, saveErr)
	}
	c.logNotSent(ctx, rec, err)
	c.keys.notSent(rec.Key)
	return err
}

// recordAnswer records the final answer of a call and returns it. It adds an
// *APIError if the answer is not a success. It adds a *SaveError if the answer
// was not saved.
func (c *life) recordAnswer(ctx context.Context, in *Intent, rec *persist.Record, resp *Response, room *nextVersion, arbitrate func(context.Context, *Intent, *disputedError) error) (*Response, error) {
	rec.Attempts += resp.Attempts
	rec.UpdatedAt = c.set.clock.Now()
	rec.State = c.set.stateFor(resp.StatusCode, resp.Header, resp.Body)
	// The caller owns resp; the record keeps its own copy.
	rec.Response = c.set.storedIn(&room.answer, resp)
	if c.set.logs(ctx, slog.LevelInfo) { // skip building the line when silent
		c.set.logger.LogAttrs(ctx, slog.LevelInfo,
			fmt.Sprintf("idem: answered %d %s after %d attempt(s)", resp.StatusCode, http.StatusText(resp.StatusCode), resp.Attempts),
			slog.String("key", rec.Key), slog.String("name", rec.Name), slog.Bool("replayed", resp.Replayed))
	}
	// The answer is final whatever happens to the save. The server keeps it
	// and replays it to the next Do. Save even if ctx is done now. Then a
	// cancel right after the answer does not cost the record.
	//
	// The save need not be durable before Do returns. It must be durable
	// before the server forgets the key. Until then, a crash of the process
	// leaves it written. A power loss leaves the intent unresolved. Do resumes
	// it with the same key and gets the server's replay of this answer. So a
	// store that can defers its sync (persist.WithDeferredSync). That keeps
	// the sync off the path the user waits on.
	saveErr := c.saveWith(detached(ctx), in, rec, &room.clocks, "record outcome", func(ctx context.Context, s persist.Store, rec, prev *persist.Record) error {
		return c.writeOwn(persist.WithDeferredSync(ctx), s, rec, prev)
	})
	if d := disputed(saveErr); d != nil {
		// The answer is not told while the server's lookup may say it was
		// not the server's.
		if saveErr = arbitrate(ctx, in, d); saveErr != nil && !errors.As(saveErr, new(*adoptedError)) {
			return nil, saveErr
		}
	}
	if saveErr != nil && errors.As(saveErr, new(*adoptedError)) {
		// Another call stored the server's word first, and it stands.
		return c.adopted(saveErr)
	}
	if saveErr == nil {
		c.keys.forget(rec.Key)
	} else {
		// The answer is never reported as "not sent". It is returned, marked
		// as not recorded.
		resp.NotRecorded = true
	}
	apiErr := c.set.apiErrorFor(rec, resp)
	switch {
	case apiErr != nil && saveErr != nil:
		return resp, errors.Join(apiErr, saveErr)
	case apiErr != nil:
		return resp, apiErr
	case saveErr != nil:
		return resp, saveErr
	}
	return resp, nil
}

// logUnknown tells the app's logger (WARN, above INFO) of a call that ended
// with its outcome unknown, and why.
func (c *life) logUnknown(ctx context.Context, rec *persist.Record, err *RetryError) {
	if c.set.logs(ctx, slog.LevelWarn) {
		c.set.logger.LogAttrs(ctx, slog.LevelWarn, fmt.Sprintf("idem: outcome unknown after %d attempt(s): %s", err.Attempts, err.Reason),
			slog.String("key", rec.Key), slog.String("name", rec.Name))
	}
}

// logNotSent tells the app's logger (INFO) of a call that ended not sent,
// once the store says so.
func (c *life) logNotSent(ctx context.Context, rec *persist.Record, err *notSentError) {
	if c.set.logs(ctx, slog.LevelInfo) {
		c.set.logger.LogAttrs(ctx, slog.LevelInfo, fmt.Sprintf("idem: not sent after %d attempt(s): %s", err.Attempts, err.Reason),
			slog.String("key", rec.Key), slog.String("name", rec.Name), slog.String("error", err.Err.Error()))
	}
}

// storedOutcome answers Do for a resolved intent without sending.
func (c *life) storedOutcome(rec *persist.Record) (*Response, error) {
	if rec.Response == nil {
		// Resolved without an answer: reconciled as never done.
		return nil, fmt.Errorf("idem: intent %s is %s: the server has no effect for its key; create a new intent to try again", rec.Key, rec.State)
	}
	resp := responseFromStored(rec.Response, 0, true)
	if err := c.set.apiErrorFor(rec, resp); err != nil {
		return resp, err
	}
	return resp, nil
}

// save makes rec the intent's current version and stores it. It writes over
// the version the store holds only as afterConflict allows. rec must not be
// changed afterwards.
func (c *life) save(ctx context.Context, in *Intent, rec *persist.Record, op string) error {
	return c.saveWith(ctx, in, rec, nil, op, c.writeOwn)
}

// writeOwn writes rec, starting from prev, the version this Client holds. The
// store's write is conditional. When another version is stored now,
// afterConflict decides. A resolved record is never overwritten. writeOwn
// returns an *adoptedError holding it then, or a *disputedError for a void
// that the answer in hand disputes. Another Client's record is never
// overwritten either, but by the server's answer. Then the store's
// *ConflictError is returned. Only this Client's own later version is written
// over, or a record gone from the store (Forget).
func (c *life) writeOwn(ctx context.Context, s persist.Store, rec, prev *persist.Record) error {
	for range 8 {
		err := s.Write(ctx, rec, prev)
		if err == nil {
			return nil
		}
		var changed *persist.ConflictError
		if !errors.As(err, &changed) {
			return err
		}
		switch afterConflict(changed.Current, rec, prev, c.id) {
		case cLanded:
			return nil
		case cAdopt:
			return &adoptedError{rec: changed.Current}
		case cYield, cRefused:
			return err
		case cDisputed:
			return &disputedError{void: changed.Current, answer: rec}
		}
		prev = changed.Current
	}
	return fmt.Errorf("idem: intent %s changed under every write", rec.Key)
}

// atActionEnd moves rec, a record about to be written over a void, to its
// action's end, if it is a payment. A void is the one resolved record that
// may change. The action may have moved on since it was stored void: a
// changed cart was declined, or voided too, or paid. Written over the void,
// the payment must decide the action's next intent, as its latest. So rec
// takes the Seq after every stored record of its action. Any other record
// keeps its place: an unknown outcome may yet prove void, and must not
// stand before a later payment. A record of no action keeps its Seq too. A
// Client that claims the same Seq at the same moment may still come first
// (docs/CLIENT.md, "What cannot be protected").
func atActionEnd(ctx context.Context, s persist.Store, rec *persist.Record) error {
	if rec.Name == "" || rec.State != persist.StateSucceeded {
		return nil
	}
	recs, err := s.List(ctx, persist.Filter{Name: rec.Name})
	if err != nil {
		return fmt.Errorf("idem: reading the intents of action %q: %w: %w", rec.Name, ErrOutcomeUnknown, err)
	}
	for _, r := range recs {
		if r.Key != rec.Key && r.Seq >= rec.Seq {
			rec.Seq = r.Seq + 1
		}
	}
	return nil
}

// saveOverVoid saves rec over the void that in holds, by overVoid. A payment
// first moves to its action's end (atActionEnd).
func (c *life) saveOverVoid(ctx context.Context, in *Intent, rec *persist.Record, op string) error {
	if err := atActionEnd(ctx, c.set.store, rec); err != nil {
		return err
	}
	return c.saveWith(ctx, in, rec, nil, op, overVoid)
}

// overVoid writes rec, the answer the server's lookup confirmed, over void,
// another Client's void of its intent, once. The write is conditional on
// the void's version. When it fails the stored record is unknown, so is the
// outcome. It is never told void.
func overVoid(ctx context.Context, s persist.Store, rec, void *persist.Record) error {
	if err := s.Write(ctx, rec, void); err != nil {
		return fmt.Errorf("%w: the server answered, but the intent was stored void meanwhile and could not be written over: %w", ErrOutcomeUnknown, err)
	}
	return nil
}

// disputedError is a write of an answer refused because another Client
// stored the intent void meanwhile (cDisputed).
type disputedError struct{ void, answer *persist.Record }

// disputed returns the dispute that err, a save's error, holds, or nil.
// A save that succeeded costs nothing to ask.
func disputed(err error) *disputedError {
	if err == nil {
		return nil
	}
	var d *disputedError
	if errors.As(err, &d) {
		return d
	}
	return nil
}

func (e *disputedError) Error() string {
	return fmt.Sprintf("idem: intent %s got an answer, but another Client stored it void meanwhile", e.void.Key)
}

// adoptedError is a write refused because the stored record is resolved. That
// record is the server's word, which the caller adopts and tells.
type adoptedError struct{ rec *persist.Record }

func (e *adoptedError) Error() string {
	return fmt.Sprintf("idem: intent %s is already %s", e.rec.Key, e.rec.State)
}

// adopted answers a call whose record another Client or call resolved while it
// ran. It returns the stored outcome, if err says so, else err.
func (c *life) adopted(err error) (*Response, error) {
	var a *adoptedError
	if errors.As(err, &a) {
		c.keys.forget(a.rec.Key)
		return c.storedOutcome(a.rec)
	}
	return nil, err
}

// saveIf is save only if the stored record is still old's version
// (persist.SaveIf).
func (c *life) saveIf(ctx context.Context, in *Intent, rec, old *persist.Record, op string) error {
	return c.saveWith(ctx, in, rec, nil, op, func(ctx context.Context, s persist.Store, rec, _ *persist.Record) error {
		return persist.SaveIf(ctx, s, rec, old)
	})
}

// saveWith is save through store, by writeOwn or persist.SaveIf. prev is the
// version in held before. The write's clock readings go to cl. cl is memory
// made with rec's version that no record holds yet. When cl is nil, they go to
// new memory.
func (c *life) saveWith(ctx context.Context, in *Intent, rec *persist.Record, cl *persist.Clocks, op string, store func(ctx context.Context, s persist.Store, rec, prev *persist.Record) error) error {
	if !in.ephemeral {
		if cl == nil {
			cl = new(persist.Clocks)
		}
		c.stamp(rec, cl, false)
	}
	rec.Rev = c.revs.next()
	prev := in.current()
	in.set(rec)
	if in.ephemeral {
		return nil
	}
	// The record is immutable from here on (see Intent.current). So the store
	// may keep it rather than copy it.
	if err := store(ctx, c.set.store, rec, prev); err != nil {
		// The intent is what the store holds. State does not report an outcome
		// that was not saved, such as a void that Reconcile concluded. Else
		// the app could act on it while the store would send the intent again.
		in.set(prev)
		var a *adoptedError
		if errors.As(err, &a) {
			in.set(a.rec)
		}
		c.keys.saved.drop(rec.Key)
		c.set.log(ctx, slog.LevelError, "idem: save failed", "key", rec.Key, "op", op, "error", err)
		return &SaveError{Key: rec.Key, Op: op, Err: err}
	}
	c.keys.saved.saved(rec)
	return nil
}

// left returns how long the intent of rec may still be sent, by the
// largest age any clock reports.
func (c *life) left(rec *persist.Record) time.Duration {
	return c.leftAt(rec, c.clocks.read())
}

// leftAt is left on r, a reading of the clocks taken now.
func (c *life) leftAt(rec *persist.Record, r reading) time.Duration {
	l := c.leftOf(rec)
	return l.leftAt(r)
}

// leftOf is the reading of how long the intent of rec may still be sent
// that a call's budget holds.
func (c *life) leftOf(rec *persist.Record) intentLeft {
	return intentLeft{clocks: c.clocks, clock: c.set.clock, keys: c.keys, window: c.set.retention - c.set.margin, rec: rec}
}

// intentLeft is the budget's reading of how long a call's intent may still be
// sent (Client.left). It is read again before every attempt and wait. It is
// the server's retention less the safety margin, less the intent's age. The
// age is the largest any clock reports (clocks.age). It is never less than
// since this Client first saw the intent.
type intentLeft struct {
	clocks *clocks
	clock  clock.Clock
	keys   *keys
	window time.Duration
	rec    *persist.Record
}

// leftAt is left on r, a reading of the clocks taken now.
func (l *intentLeft) leftAt(r reading) time.Duration {
	return l.window - l.clocks.age(l.rec, r, func(at time.Duration) time.Duration { return l.keys.bornAt(l.rec.Key, at) })
}

// detached returns ctx without its cancel. So a save that records what
// happened is made even after the caller's context ended. It returns ctx
// itself when nothing can cancel it (its Done is nil), which saves the
// wrapper.
func detached(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}
