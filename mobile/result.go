package mobile

import (
	"bytes"
	"errors"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// Outcomes of a Result.
const (
	// OutcomeSucceeded: the server did the work (2xx). Show the receipt.
	OutcomeSucceeded = "succeeded"
	// OutcomeAlreadyPaid: the action was paid earlier, by a payment with
	// another request. The cart changed after it was paid. Nothing was
	// sent for this one. Key, Status and Body are the earlier payment's,
	// from the device. Body is empty once Prune has kept only its
	// tombstone. Show that the action is paid, not a receipt for this
	// request. PayAnew pays again, deliberately.
	OutcomeAlreadyPaid = "already_paid"
	// OutcomeFailed: a final business answer, such as a declined card.
	// The intent is resolved; PayAnew starts a new payment.
	OutcomeFailed = "failed"
	// OutcomeRejected: the server refused the request or its key (422,
	// or a 400 about the key). It is a bug to report, not a payment to
	// retry.
	OutcomeRejected = "rejected"
	// OutcomeUnknown: no final answer yet; the payment may have been
	// made. Never pay anew: Settle it later.
	OutcomeUnknown = "unknown"
	// OutcomeExpired: outcome unknown and the intent is too old to send
	// again. Settle it: the server's lookup decides.
	OutcomeExpired = "expired"
	// OutcomeVoid: the server never did it. A new payment is safe.
	OutcomeVoid = "void"
	// OutcomeNotSent: the request never left the device. There was no
	// network, or the host was not found, or the connection or the
	// certificate was refused. So nothing was paid. Tell the user. Pay
	// again only when they ask. A changed cart starts a new payment.
	OutcomeNotSent = "not_sent"
	// OutcomeBlocked: an earlier intent for the same action is
	// unresolved. A new one could pay twice. Result.Key names it: settle
	// it first.
	OutcomeBlocked = "blocked"
)

// Result is what became of an intent after a call.
type Result struct {
	// Outcome is one of the Outcome constants: what became of the intent.
	Outcome string
	// Kind is one of the Kind constants: how the call ended. It is finer
	// than Outcome where there is more to say, and Outcome's word
	// otherwise. A device failure may meet an intent that may have been
	// sent. That is OutcomeUnknown, with the failure's kind. Compare
	// Kind. Never parse Detail.
	Kind string
	// Key is the intent's Idempotency-Key. For OutcomeBlocked, it is the
	// key of the unresolved intent that blocks. For OutcomeAlreadyPaid,
	// it is the key of the payment that paid the action.
	Key string
	// Status is the final answer's HTTP status. For OutcomeUnknown it is
	// the last answer's. It is 0 when none came.
	Status int64
	// Body is the final answer's body.
	Body []byte
	// Replayed: the server answered from its idempotency record. An
	// earlier attempt, whose answer was lost, did the work.
	Replayed bool
	// FromStore: the intent was already resolved on the device and
	// nothing was sent.
	FromStore bool
	// Oversized: the final answer was larger than the client keeps. Its
	// status settled the intent, and Body is empty.
	Oversized bool
	// NotRecorded: the final answer arrived, but the device could not
	// save it. Its storage may be full, say. Outcome and Status are the
	// server's, and true. The intent stays unresolved on the device.
	// Settle later gets the server's replay of the same answer. The call
	// returns no error, since the payment was sent and answered.
	NotRecorded bool
	// Attempts is how many attempts this call sent.
	Attempts int64
	// ProblemType is the RFC 9457 problem type of a non-2xx answer, or "".
	ProblemType string
	// Detail says more, for logs: the reason a call stopped without a
	// final answer, or the problem's detail.
	Detail string
}

// resultOf maps a call's outcome to a Result, or to a device error.
func resultOf(in *idem.Intent, resp *idem.Response, err error) (*Result, error) {
	r, derr := mapResult(in, resp, err)
	if r != nil && errors.As(err, new(*authError)) {
		switch r.Outcome {
		case OutcomeNotSent, OutcomeUnknown, OutcomeExpired:
			// The Authorizer ended the call: the app signs in again.
			r.Kind = KindAuthorizer
		}
	}
	return r, derr
}

// mapResult is resultOf but for the Authorizer's failures.
func mapResult(in *idem.Intent, resp *idem.Response, err error) (*Result, error) {
	r := newResult(in, resp)
	if resp != nil && resp.NotRecorded {
		// An answer is never reported as a storage error, whose meaning
		// is "nothing was sent".
		return notRecorded(r, err), nil
	}
	var (
		apiErr   *idem.APIError
		retryErr *idem.RetryError
		unres    *idem.UnresolvedError
		resolved *idem.ResolvedError
	)
	switch {
	case errors.Is(err, idem.ErrNotSent):
		r.Outcome, r.Kind = OutcomeNotSent, KindNotSent
		r.Detail = err.Error()
		return r, nil
	case errors.As(err, &resolved):
		return alreadyPaid(r, resolved), nil
	case errors.As(err, &unres):
		r.Outcome, r.Kind = OutcomeBlocked, KindBlocked
		if unres.Previous != nil {
			r.Key = unres.Previous.Key()
		}
		r.Detail = unres.Error()
		return r, nil
	case errors.As(err, &retryErr):
		return noFinalAnswer(r, in, retryErr, err), nil
	case errors.As(err, &apiErr):
		r.ProblemType = apiErr.Problem.Type
		r.Detail = apiErr.Problem.Detail
	case errors.Is(err, idem.ErrOutcomeUnknown):
		r.Outcome = OutcomeUnknown
		r.Kind = unknownKind(r.Outcome, err)
		r.Detail = err.Error()
		return r, nil
	case err != nil && in != nil && !in.State().Resolved():
		return deviceFailure(r, in, err)
	}
	return fromState(r, in, err)
}

// newResult starts a Result with the intent's key and the answer, if one
// came.
func newResult(in *idem.Intent, resp *idem.Response) *Result {
	r := &Result{}
	if in != nil {
		r.Key = in.Key()
	}
	if resp != nil {
		r.Status = int64(resp.StatusCode)
		r.Body = bytes.Clone(resp.Body)
		r.Replayed = resp.Replayed
		r.FromStore = resp.FromStore
		r.Oversized = resp.Oversized
		r.Attempts = int64(resp.Attempts)
	}
	return r
}

// notRecorded maps a final answer the device could not save. The outcome
// is the server's: a success, or the failure or refusal that err carries.
func notRecorded(r *Result, err error) *Result {
	r.NotRecorded = true
	r.Outcome, r.Kind = OutcomeSucceeded, KindSucceeded
	var apiErr *idem.APIError
	if errors.As(err, &apiErr) {
		r.ProblemType, r.Detail = apiErr.Problem.Type, apiErr.Problem.Detail
		r.Outcome, r.Kind = OutcomeFailed, KindFailed
		if errors.Is(err, idem.ErrKeyReused) || errors.Is(err, idem.ErrKeyRejected) {
			r.Outcome, r.Kind = OutcomeRejected, rejectedKind(err)
		}
	}
	return r
}

// alreadyPaid maps an action paid earlier, by an intent with another
// request. Nothing was sent for this one, which was never made. The
// Result is that payment's: the app shows the action paid, and never
// takes it for a receipt of this request.
func alreadyPaid(r *Result, resolved *idem.ResolvedError) *Result {
	r.Outcome, r.Kind, r.FromStore, r.Detail = OutcomeAlreadyPaid, KindAlreadyPaid, true, resolved.Error()
	if resolved.Previous != nil {
		r.Key = resolved.Previous.Key()
		if prev := resolved.Previous.Response(); prev != nil {
			r.Status, r.Body, r.Replayed, r.Oversized = int64(prev.StatusCode), bytes.Clone(prev.Body), prev.Replayed, prev.Oversized
		}
	}
	return r
}

// noFinalAnswer maps retries that ended without a final answer. The
// outcome is unknown, or expired when the intent is too old to send.
func noFinalAnswer(r *Result, in *idem.Intent, retryErr *idem.RetryError, err error) *Result {
	r.Attempts = int64(retryErr.Attempts)
	if retryErr.LastResponse != nil {
		r.Status = int64(retryErr.LastResponse.StatusCode)
	}
	r.Outcome = OutcomeUnknown
	if in != nil && in.State() == persist.StateExpired {
		r.Outcome = OutcomeExpired
	}
	r.Kind = unknownKind(r.Outcome, err)
	r.Detail = err.Error()
	return r
}

// deviceFailure maps a failure on the device while the intent is
// unresolved. It is a Result when the intent may have been sent, and an
// error of the device when it was not.
func deviceFailure(r *Result, in *idem.Intent, err error) (*Result, error) {
	if s := in.State(); s == persist.StatePending || s == persist.StateExpired {
		// The intent may have been sent, by this call or an earlier
		// one: a failure on the device says nothing of the payment,
		// and a device error would say that nothing was sent.
		r.Outcome = outcomeOf(s)
		r.Kind = ErrorKind(deviceError(err))
		r.Detail = err.Error()
		return r, nil
	}
	return nil, deviceError(err)
}

// fromState maps the intent's state after the call. Without an intent, a
// call with no error succeeded, and an error is the device's.
func fromState(r *Result, in *idem.Intent, err error) (*Result, error) {
	if in != nil {
		r.Outcome = outcomeOf(in.State())
	}
	if r.Outcome == "" {
		if err != nil {
			return nil, deviceError(err)
		}
		r.Outcome = OutcomeSucceeded
	}
	r.Kind = r.Outcome
	if r.Outcome == OutcomeRejected {
		r.Kind = rejectedKind(err)
	}
	return r, nil
}

// rejectedKind says why the server refused a request, from the error
// that carries its answer.
func rejectedKind(err error) string {
	switch {
	case errors.Is(err, idem.ErrKeyReused):
		return KindKeyReused
	case errors.Is(err, idem.ErrKeyRejected):
		return KindKeyRejected
	}
	return KindRejected
}

// unknownKind says why an outcome is unknown: a write the device could
// not make (the intent may have been sent), or no final answer.
func unknownKind(outcome string, err error) string {
	var save *idem.SaveError
	if errors.As(err, &save) {
		return KindStorage
	}
	return outcome
}

func outcomeOf(s persist.State) string {
	switch s {
	case persist.StateSucceeded:
		return OutcomeSucceeded
	case persist.StateFailed:
		return OutcomeFailed
	case persist.StateRejected:
		return OutcomeRejected
	case persist.StateExpired:
		return OutcomeExpired
	case persist.StateVoid:
		return OutcomeVoid
	case persist.StateNotSent:
		return OutcomeNotSent
	}
	return OutcomeUnknown
}

// deviceError gives a Go error its kind.
func deviceError(err error) error {
	var e *deviceErr
	var auth *authError
	var save *idem.SaveError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &auth):
		return newError(KindAuthorizer, auth.Error())
	case errors.Is(err, persist.ErrLocked):
		return newError(KindLocked, err.Error())
	case errors.Is(err, persist.ErrClosed):
		return newError(KindClosed, err.Error())
	case errors.Is(err, persist.ErrNotFound):
		return newError(KindNotFound, err.Error())
	case errors.As(err, &save):
		return newError(KindStorage, err.Error())
	}
	return newError(KindInternal, err.Error())
}
