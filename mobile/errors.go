package mobile

import (
	"errors"
	"strings"
)

// Kinds say how a call ended, as a code to compare. A call that returns a
// Result gives it in Result.Kind. A call that fails gives it through
// ErrorKind, passed the exception itself. Nothing parses a message, since
// messages are for logs and may change.
//
// A Result's Kind is its Outcome's word when there is nothing finer to
// say. KindSucceeded is OutcomeSucceeded, and so on. Otherwise it is a
// finer word. KindKeyReused is one way of OutcomeRejected. KindStorage and
// KindAuthorizer are ways of OutcomeUnknown or OutcomeNotSent.
const (
	// KindSucceeded: the server did the work (OutcomeSucceeded).
	KindSucceeded = OutcomeSucceeded
	// KindAlreadyPaid: the action was paid earlier with another request
	// (OutcomeAlreadyPaid). Nothing was sent.
	KindAlreadyPaid = OutcomeAlreadyPaid
	// KindFailed: a final business answer, such as a declined card
	// (OutcomeFailed).
	KindFailed = OutcomeFailed
	// KindRejected: the server refused the request (OutcomeRejected), for
	// another reason than its key.
	KindRejected = OutcomeRejected
	// KindKeyReused: the server saw the key with another request
	// (OutcomeRejected). A bug in the app: a changed request is a new
	// payment.
	KindKeyReused = "key_reused"
	// KindKeyRejected: the server refused the key itself, missing or
	// malformed (OutcomeRejected).
	KindKeyRejected = "key_rejected"
	// KindVoid: the server never did it (OutcomeVoid).
	KindVoid = OutcomeVoid
	// KindExpired: the outcome is unknown and the intent too old to send
	// again (OutcomeExpired).
	KindExpired = OutcomeExpired
	// KindBlocked: an earlier intent for the action is unresolved
	// (OutcomeBlocked).
	KindBlocked = OutcomeBlocked
	// KindNotSent: the request never left the device (OutcomeNotSent).
	KindNotSent = OutcomeNotSent
	// KindUnknown: no final answer yet (OutcomeUnknown). The attempts or
	// the budget ran out, or an answer was not the server's.
	KindUnknown = OutcomeUnknown

	// KindStorage: the device could not read or write the state
	// directory (full, read-only, damaged). As a Result's Kind, it comes
	// with OutcomeUnknown or OutcomeExpired. A write then failed for an
	// intent that may have been sent. So the payment may have been made;
	// settle it later. As ErrorKind's, it means nothing was sent.
	KindStorage = "storage"
	// KindAuthorizer: the Authorizer threw, which ends the call. It is
	// only a Result's Kind. Its Outcome says what became of the intent.
	// OutcomeNotSent means no attempt was sent: sign in, then Pay again.
	// OutcomeUnknown means one may have been: settle it later.
	KindAuthorizer = "authorizer"

	// KindBadInput: the Config or an argument is wrong. Nothing was sent.
	KindBadInput = "bad_input"
	// KindLocked: the state directory is in use by another Client, in this
	// process or another. Close it first.
	KindLocked = "locked"
	// KindNotFound: no intent has that key on this device.
	KindNotFound = "not_found"
	// KindClosed: the Client is closed.
	KindClosed = "closed"
	// KindCanceled (one l): the call was cancelled through its Cancel
	// handle. The intent keeps its state. One that may have been sent is
	// unresolved, and SettleAll settles it later.
	KindCanceled = "canceled"
	// KindInternal: anything else, such as an exception this package did
	// not make.
	KindInternal = "internal"
)

// kindConfig is KindBadInput under the name config.go uses.
const kindConfig = KindBadInput

// deviceErr is a device error with its kind.
type deviceErr struct {
	kind string
	msg  string
}

// newError makes a device error. Its message names the library, not the
// kind. ErrorKind reads the kind from the error itself.
func newError(kind, msg string) *deviceErr {
	if !strings.HasPrefix(msg, "idem") && !strings.HasPrefix(msg, "persist") {
		msg = "idem: " + msg
	}
	return &deviceErr{kind: kind, msg: msg}
}

func (e *deviceErr) Error() string { return e.msg }

// ErrorKind returns the kind of an error that a call of this package
// returned. That is KindBadInput, KindLocked, KindStorage, KindNotFound,
// KindClosed or KindCanceled, or else KindInternal. Pass it the exception
// itself, not its message. gobind hands the Go error back to Go, whose
// kind this reads. In Kotlin, call Mobile.errorKind(e) in a catch. In
// Swift, call MobileErrorKind(error as NSError). An exception of another
// origin is KindInternal, and nil is "".
func ErrorKind(err error) string {
	if err == nil {
		return ""
	}
	// errors.As only looks at types and Unwrap methods. It never calls
	// Error, which on an exception thrown by Java or Swift code would
	// call back into it.
	var e *deviceErr
	if errors.As(err, &e) {
		return e.kind
	}
	return KindInternal
}
