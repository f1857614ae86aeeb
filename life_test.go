package idem

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/persist"
)

// TestLife checks the table of an intent's life, one row per rule that
// keeps a promise: what may be sent, what is told "not sent", what a
// changed request may replace.
func TestLife(t *testing.T) {
	for _, tc := range []struct {
		name string
		from phase
		on   event
		to   phase
		do   verdict
	}{
		{"the tap arms an unarmed intent", phaseUnarmed, evArm, phaseArmed, vKeep},
		{"an arming claim that wrote proves an earlier failed one did not land", phaseMaySent, evArm, phaseArmed, vKeep},
		{"a failed arming write may have armed the intent", phaseUnarmed, evStoreFailed, phaseMaySent, vUnknown},
		{"a replaced intent is never armed", phaseDropped, evArm, phaseDropped, vRefuse},
		{"an intent this Client armed is sent as provably unsent", phaseArmed, evBegin, phaseSending, vSendUnsent},
		{"an armed record read from the store may have been sent", phaseStored, evBegin, phaseMaySent, vSend},
		{"the app's call sends a not-sent intent again", phaseNotSent, evBegin, phaseSending, vSendUnsent},
		{"a not-sent intent is never sent by SettleAll", phaseNotSent, evBeginBackground, phaseNotSent, vRefuseNotSent},
		{"SettleAll sends what may have been sent", phaseStored, evBeginBackground, phaseMaySent, vSend},
		{"a replaced intent is never sent", phaseDropped, evBegin, phaseDropped, vRefuse},
		{"a second call at once makes neither provably unsent", phaseSending, evBegin, phaseMaySent, vSend},
		{"an unarmed intent is never sent before the tap", phaseUnarmed, evBegin, phaseUnarmed, vRefuse},
		{"a resolved intent is answered from the store", phaseResolved, evBegin, phaseResolved, vResolved},
		{"an attempt that wrote its headers may have been sent", phaseSending, evWrote, phaseMaySent, vSend},
		{"a call that wrote nothing ends not sent", phaseSending, evEnded, phaseNotSent, vNotSent},
		{"a call after a write ends with the outcome unknown", phaseMaySent, evEnded, phaseMaySent, vUnknown},
		{"a call that began no attempt leaves the intent unsent", phaseSending, evNoAttempt, phaseArmed, vUnknown},
		{"a call that began no attempt leaves a sent intent may-be-sent", phaseMaySent, evNoAttempt, phaseMaySent, vUnknown},
		{"a handed-out request never ends not sent", phaseHandedOut, evEnded, phaseHandedOut, vUnknown},
		{"a failed not-sent write is not not sent", phaseSending, evStoreFailed, phaseArmed, vUnknown},
		{"the server's word resolves a may-be-sent intent", phaseMaySent, evAnswer, phaseResolved, vResolved},
		{"the server's word resolves a handed-out intent", phaseHandedOut, evAnswer, phaseResolved, vResolved},
		{"a handed-out intent stays handed out on a call", phaseHandedOut, evBegin, phaseHandedOut, vSend},
		{"a request is handed out once stored so", phaseArmed, evHandOut, phaseHandedOut, vHandOut},
		{"a replaced intent is never handed out", phaseDropped, evHandOut, phaseDropped, vRefuse},
		{"the app's send ended leaves it may-be-sent", phaseHandedOut, evSendEnded, phaseMaySent, vKeep},
		{"a changed cart replaces an unarmed intent", phaseUnarmed, evReplace, phaseDropped, vDrop},
		{"a changed cart replaces an armed intent never sent", phaseArmed, evReplace, phaseDropped, vDrop},
		{"a changed cart replaces a not-sent intent", phaseNotSent, evReplace, phaseDropped, vDrop},
		{"a changed cart never replaces a handed-out intent", phaseHandedOut, evReplace, phaseHandedOut, vRefuse},
		{"a changed cart never replaces an intent being sent", phaseSending, evReplace, phaseSending, vRefuse},
		{"a changed cart never replaces what may have been sent", phaseMaySent, evReplace, phaseMaySent, vRefuse},
		{"a changed cart never replaces another process's armed intent", phaseStored, evReplace, phaseStored, vRefuse},
		{"forget drops whatever the phase", phaseMaySent, evForget, phaseDropped, vDrop},
		{"a pair the table does not name is refused", phaseResolved, evHandOut, phaseResolved, vRefuse},
		{"a may-be-sent intent never becomes not sent", phaseMaySent, evSendEnded, phaseMaySent, vRefuse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to, do := step(tc.from, tc.on)
			if to != tc.to || do != tc.do {
				t.Errorf("%s on %s: got %s, %s; want %s, %s", tc.from, tc.on, to, do, tc.to, tc.do)
			}
		})
	}

	// The table's one invariant over every pair: nothing moves a key that may
	// have been sent back to a phase that claims it was not, except a durable
	// "not sent" from a call that began unsent.
	t.Run("nothing moves what may have been sent back to unsent", func(t *testing.T) {
		unsent := map[phase]bool{phaseUnarmed: true, phaseArmed: true, phaseSending: true, phaseNotSent: true}
		for p := phase(0); p < nPhases; p++ {
			for e := event(0); e < nEvents; e++ {
				to, _ := step(p, e)
				// The claim of the arming write proves that no record of the
				// key was stored: the one way back.
				if !unsent[p] && p != phaseDropped && unsent[to] && e != evArm {
					t.Errorf("%s on %s moves to %s: what may have been sent becomes provably unsent", p, e, to)
				}
			}
		}
	})

	// The keys' use of the table where the table alone cannot tell: when a
	// call was asked for.
	t.Run("a call the app asked for before the intent ended not sent never sends it", func(t *testing.T) {
		k := newKeys("self")
		rec := &persist.Record{Key: "k1", State: persist.StateNew}
		k.armed(rec.Key, 0)
		asked := k.callTick() // a Settle begins, racing the tap
		_, err := k.begin(rec, false, k.callTick())
		require.NoError(t, err)
		require.Equal(t, vNotSent, k.ended(rec.Key, false, reading{}))
		k.notSent(rec.Key)
		stored := &persist.Record{Key: "k1", State: persist.StateNotSent}
		_, err = k.begin(stored, false, asked)
		require.ErrorIs(t, err, ErrNotSent, "the racing call is not the app asking again")
		unsent, err := k.begin(stored, false, k.callTick())
		require.NoError(t, err, "a call asked for afterwards is")
		assert.True(t, unsent)
	})
}

// TestAfterConflict checks what a refused write does with the record the
// store holds now: a resolved record or another Client's is never written
// over.
func TestAfterConflict(t *testing.T) {
	const self, other = "self", "other"
	mine := &persist.Record{Key: "k", Rev: "r1", State: persist.StatePending, Holder: self}
	write := &persist.Record{Key: "k", Rev: "r2", State: persist.StateExpired, Holder: self}
	for _, tc := range []struct {
		name   string
		stored *persist.Record
		prev   *persist.Record
		want   conflictMove
	}{
		{"a write that landed before is taken as landed", write, mine, cLanded},
		{"a resolved record is adopted, never overwritten", &persist.Record{Key: "k", Rev: "r3", State: persist.StateSucceeded, Holder: other}, mine, cAdopt},
		{"a record this Client resolved is adopted too", &persist.Record{Key: "k", Rev: "r3", State: persist.StateVoid, Holder: self}, mine, cAdopt},
		{"another Client's record is never overwritten", &persist.Record{Key: "k", Rev: "r3", State: persist.StatePending, Holder: other}, mine, cYield},
		{"another Client's not-sent record is never overwritten", &persist.Record{Key: "k", Rev: "r3", State: persist.StateNotSent, Holder: other}, mine, cYield},
		{"the server's answer settles another Client's record", &persist.Record{Key: "k", Rev: "r3", State: persist.StatePending, Holder: other}, mine, cOver},
		{"this Client's own later version is written over", &persist.Record{Key: "k", Rev: "r3", State: persist.StatePending, Holder: self}, mine, cOver},
		{"a forgotten record is written again", nil, mine, cOver},
		{"another key refuses", &persist.Record{Key: "k2", Rev: "r3", State: persist.StatePending, Holder: self}, mine, cRefused},
		{"a first write that finds a record refuses", nil, nil, cRefused},
		{"the server's answer disputes another Client's void", &persist.Record{Key: "k", Rev: "r3", State: persist.StateVoid, Holder: other}, mine, cDisputed},
		{"the server's answer adopts another Client's stored answer", &persist.Record{Key: "k", Rev: "r3", State: persist.StateFailed, Holder: other, Response: &persist.Response{StatusCode: 402}}, mine, cAdopt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := write
			if strings.HasPrefix(tc.name, "the server's answer") {
				w = &persist.Record{Key: "k", Rev: "r2", State: persist.StateSucceeded, Holder: self, Response: &persist.Response{StatusCode: 201}}
			}
			assert.Equal(t, tc.want, afterConflict(tc.stored, w, tc.prev, self))
		})
	}

	// The answer the lookup confirmed is written over the void once,
	// conditional on the void's version. When the record changed again,
	// what it holds is unknown to the writer: the outcome is unknown, never
	// the void adopted.
	t.Run("an answer that cannot be written over a void is an unknown outcome, never void", func(t *testing.T) {
		ctx := context.Background()
		base := persist.Record{Key: "k", Method: http.MethodPost, URL: "https://api.example/payments", CreatedAt: time.Unix(1, 0)}
		rec := func(rev string, state persist.State, holder string) *persist.Record {
			r := base
			r.Rev, r.State, r.Holder = rev, state, holder
			return &r
		}
		mine := rec("r1", persist.StatePending, self)
		answer := rec("r2", persist.StateSucceeded, self)
		answer.Response = &persist.Response{StatusCode: 201}
		void := rec("r3", persist.StateVoid, other)
		store := persist.NewMemory(nil)
		require.NoError(t, store.Write(ctx, mine, nil))
		require.NoError(t, store.Write(ctx, void, mine))
		var d *disputedError
		require.ErrorAs(t, (&life{id: self}).writeOwn(ctx, store, answer, mine), &d, "the answer disputes the void")
		require.NoError(t, store.Write(ctx, rec("r4", persist.StateVoid, other), void)) // the void is written again before the answer lands

		err := overVoid(ctx, store, answer, d.void)
		require.ErrorIs(t, err, ErrOutcomeUnknown)
		require.NotErrorAs(t, err, new(*adoptedError), "the stored void is never adopted with the answer in hand")
		got, err := store.Get(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, "r4", got.Rev)
	})
}
