package idem

import (
	"fmt"

	"github.com/idemkit/idem/persist"
)

// The life of an intent, as this process knows it: one phase per key,
// moved only by the named events below, by one table. Every entry point
// asks the table what to do with a key (send it, tell "not sent", hand it
// out, say the outcome is unknown, refuse), and makes the record the
// table names durable before it acts on the answer.
//
// The store is pessimistic: an armed record may have been sent. Only this
// process's memory can prove an intent unsent, and only while it holds
// the intent from the arming write to the end of a call none of whose
// attempts wrote its request (httptrace's WroteHeaders). So the phases
// say what the process can prove, and the store's state is read through
// them (see phaseOf).

// phase is what the process knows of one key.
type phase uint8

const (
	// phaseStored: nothing beyond what the store says. An armed record
	// read so may have been sent by an earlier process or another Client.
	phaseStored phase = iota
	// phaseUnarmed: made by Intent or NewIntent, in memory only, never
	// sent. The tap arms it.
	phaseUnarmed
	// phaseArmed: this Client armed it (or holds it again after "not
	// sent") and no attempt of it can have been written since: provably
	// unsent, though the store says it may have been sent.
	phaseArmed
	// phaseSending: a call of this Client holds it and has not ended;
	// no attempt before the call can have been written.
	phaseSending
	// phaseMaySent: an attempt may have reached the server (its headers
	// were written, or no trace proves otherwise): the outcome is unknown
	// until the server's word.
	phaseMaySent
	// phaseNotSent: stored not sent and told so: nothing sends it until
	// the app asks for it again.
	phaseNotSent
	// phaseHandedOut: HTTPRequest handed its request to the app, which
	// may send it at any time: never provably unsent again.
	phaseHandedOut
	// phaseDropped: replaced by a changed request, or forgotten, while
	// provably unsent: it is never sent.
	phaseDropped
	// phaseResolved: the server's word is stored; it is never sent again.
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
	// evBegin: a call the app made for this intent (Do, Settle, Send,
	// the RoundTripper) is about to send it.
	evBegin
	// evBeginBackground: SettleAll is about to send it. It never sends
	// what the app was told was not sent.
	evBeginBackground
	// evWrote: an attempt wrote its request (httptrace's WroteHeaders),
	// or ended without a trace that proves it did not.
	evWrote
	// evAnswer: the server's word arrived (a final answer, the lookup's).
	evAnswer
	// evEnded: a call ended without the server's word, after at least one
	// attempt began.
	evEnded
	// evNoAttempt: a call ended before any attempt began (its context or
	// budget ended first).
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
	// evStoreFailed: the write a transition asked for failed, or its
	// result is unknown.
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

// verdict is what the caller is told to do, once the record of the next
// phase is durable.
type verdict uint8

const (
	// vKeep: nothing to do or tell.
	vKeep verdict = iota
	// vSend: send it; the outcome is not known yet.
	vSend
	// vSendUnsent: send it; no earlier attempt can have reached the
	// server, so a call that writes nothing may end "not sent".
	vSendUnsent
	// vNotSent: tell the app "not sent" (ErrNotSent). The record must say
	// not sent first; if that write fails, evStoreFailed.
	vNotSent
	// vRefuseNotSent: send nothing and say it was not sent: the app was
	// told so and has not asked again.
	vRefuseNotSent
	// vUnknown: the outcome is unknown (ErrOutcomeUnknown).
	vUnknown
	// vHandOut: hand the request out, once it is stored as handed out.
	vHandOut
	// vDrop: drop it (delete the stored record, conditionally).
	vDrop
	// vRefuse: refuse: it may have reached the server (UnresolvedError),
	// or it was replaced (ErrIntentReplaced).
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

// rule is one row of the table: in phase from, event on moves the key to
// phase to, and the caller does what verdict says.
type rule struct {
	from phase
	on   event
	to   phase
	do   verdict
}

// lifeRules is the table. A pair it does not name is refused and leaves
// the phase as it is (see step).
var lifeRules = []rule{
	// The tap.
	{phaseUnarmed, evArm, phaseArmed, vKeep},
	// Unarmed intents live in the Intent until then: the key's entry is
	// made by the arming write. The claim writes only where no record of
	// the key is stored, so it proves that an earlier arming write whose
	// result was unknown did not land.
	{phaseStored, evArm, phaseArmed, vKeep},
	{phaseMaySent, evArm, phaseArmed, vKeep},
	{phaseDropped, evArm, phaseDropped, vRefuse},
	// A failed arming write may have armed it: from then on it may be sent
	// by anyone who reads the store, so it is never provably unsent.
	{phaseUnarmed, evStoreFailed, phaseMaySent, vUnknown},

	// A call the app made. Only what this process armed and never wrote,
	// or the store holds as not sent, is sent as provably unsent.
	{phaseArmed, evBegin, phaseSending, vSendUnsent},
	{phaseNotSent, evBegin, phaseSending, vSendUnsent},
	{phaseStored, evBegin, phaseMaySent, vSend},
	{phaseMaySent, evBegin, phaseMaySent, vSend},
	{phaseHandedOut, evBegin, phaseHandedOut, vSend},
	{phaseDropped, evBegin, phaseDropped, vRefuse},
	{phaseUnarmed, evBegin, phaseUnarmed, vRefuse},
	{phaseResolved, evBegin, phaseResolved, vResolved},

	// SettleAll: as the app's call, but "not sent" is a promise.
	{phaseArmed, evBeginBackground, phaseSending, vSendUnsent},
	{phaseNotSent, evBeginBackground, phaseNotSent, vRefuseNotSent},
	{phaseStored, evBeginBackground, phaseMaySent, vSend},
	{phaseMaySent, evBeginBackground, phaseMaySent, vSend},
	{phaseHandedOut, evBeginBackground, phaseHandedOut, vSend},
	{phaseDropped, evBeginBackground, phaseDropped, vRefuse},
	{phaseUnarmed, evBeginBackground, phaseUnarmed, vRefuse},
	{phaseResolved, evBeginBackground, phaseResolved, vResolved},

	// Two calls at once under one key (the RoundTripper's calls that share
	// a caller's key but not a request): neither is provably unsent.
	{phaseSending, evBegin, phaseMaySent, vSend},
	{phaseSending, evBeginBackground, phaseMaySent, vSend},

	// An attempt wrote its request: judged by WroteHeaders alone.
	{phaseSending, evWrote, phaseMaySent, vSend},
	{phaseMaySent, evWrote, phaseMaySent, vSend},
	{phaseHandedOut, evWrote, phaseHandedOut, vSend},

	// The call ended without the server's word. Only a call that began
	// provably unsent and wrote nothing ends "not sent".
	{phaseSending, evEnded, phaseNotSent, vNotSent},
	{phaseMaySent, evEnded, phaseMaySent, vUnknown},
	{phaseHandedOut, evEnded, phaseHandedOut, vUnknown},
	// No attempt began: nothing changed.
	{phaseSending, evNoAttempt, phaseArmed, vUnknown},
	{phaseMaySent, evNoAttempt, phaseMaySent, vUnknown},
	{phaseHandedOut, evNoAttempt, phaseHandedOut, vUnknown},
	// The not-sent write failed: it did not make the intent not sent, and
	// the call says the outcome is unknown. No attempt was written all the
	// same: the next call that writes nothing may still end not sent.
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

	// HTTPRequest: from the moment it is handed out the app may send it.
	{phaseArmed, evHandOut, phaseHandedOut, vHandOut},
	{phaseStored, evHandOut, phaseHandedOut, vHandOut},
	{phaseMaySent, evHandOut, phaseHandedOut, vHandOut},
	{phaseNotSent, evHandOut, phaseHandedOut, vHandOut},
	{phaseHandedOut, evHandOut, phaseHandedOut, vHandOut},
	{phaseDropped, evHandOut, phaseDropped, vRefuse},
	{phaseUnarmed, evHandOut, phaseUnarmed, vRefuse},
	// The app's send ended: the request may have arrived, but nothing of
	// it is still on its way after the reconcile delay.
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

	// Forget is the deliberate unsafe path: whatever the phase.
	{phaseStored, evForget, phaseDropped, vDrop},
	{phaseUnarmed, evForget, phaseDropped, vDrop},
	{phaseArmed, evForget, phaseDropped, vDrop},
	{phaseMaySent, evForget, phaseDropped, vDrop},
	{phaseNotSent, evForget, phaseDropped, vDrop},
	{phaseHandedOut, evForget, phaseDropped, vDrop},
	{phaseResolved, evForget, phaseDropped, vDrop},
	{phaseDropped, evForget, phaseDropped, vDrop},
}

// lifeTable is lifeRules indexed by phase and event; built once.
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

// step is the one transition: the phase after e in p, and what the
// caller is told. A pair the table does not name is refused, and the
// phase stays.
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
	// cLanded: the stored record is this write: an earlier try landed and
	// its result was lost.
	cLanded conflictMove = iota
	// cAdopt: the stored record is resolved (another Client, or another
	// call, got the server's word): it is never overwritten; the caller
	// takes it for the intent's and tells it.
	cAdopt
	// cYield: another Client holds the stored record now (it took the
	// intent over, may be sending it, or stored it not sent): what this
	// Client knows short of the server's answer (attempts, expiry, a
	// void) never overwrites it, and the write fails.
	cYield
	// cOver: the stored record is this Client's own later version, or the
	// record was forgotten, or the write is the server's answer, which
	// settles any unresolved record: the write goes on from it.
	cOver
	// cRefused: the store refused for another key (the action has a later
	// intent), or a first write found a record: the write fails.
	cRefused
)

// afterConflict decides what follows a conflict: stored is the record the
// store holds now (nil if none), rec the refused write, prev the version
// it was written from, self the writing Client's holder id.
func afterConflict(stored, rec, prev *persist.Record, self string) conflictMove {
	switch {
	case persist.SameVersion(stored, rec):
		return cLanded
	case stored != nil && stored.Key != rec.Key, stored == nil && prev == nil:
		return cRefused
	case stored == nil:
		return cOver
	case stored.State.Resolved():
		return cAdopt
	case stored.Holder != self && !answered(rec):
		return cYield
	}
	return cOver
}

// answered says rec records the server's answer to the intent (the send's
// final answer, or the lookup's that the work was done): the truth about
// the key, whoever holds the record. A void is not: it is trusted only
// while no attempt can still arrive, which another holder may be sending.
func answered(rec *persist.Record) bool {
	return rec.State.Resolved() && rec.Response != nil
}
