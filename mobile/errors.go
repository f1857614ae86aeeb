package mobile

import "strings"

// The kinds of device errors, which ErrorKind returns; its comment says
// what each means. An error's message starts with "idem[kind]: ".
const (
	kindConfig     = "config"
	kindLocked     = "locked"
	kindStorage    = "storage"
	kindNotFound   = "not-found"
	kindClosed     = "closed"
	kindCanceled   = "canceled"
	kindAuthorizer = "authorizer"
	kindInternal   = "internal"
)

// deviceErr is a device error with its kind.
type deviceErr struct {
	Kind    string
	Message string
}

func newError(kind, msg string) *deviceErr { return &deviceErr{Kind: kind, Message: msg} }

func (e *deviceErr) Error() string { return "idem[" + e.Kind + "]: " + e.Message }

// ErrorKind returns the kind of an error message that this package made.
// Pass it the exception's message (Java: e.getMessage(); Kotlin: e.message; Swift:
// error.localizedDescription) and compare the string it returns:
//
//   - "config": the Config or an argument is wrong.
//   - "locked": the state directory is in use by another Client, in this
//     process or another. Close it first.
//   - "storage": the device could not read or write the state directory
//     (full, read-only, damaged). Nothing was sent. A write that may have
//     armed the intent returns a Result with OutcomeUnknown instead: a
//     later start may settle it.
//   - "not-found": no intent has that key on this device.
//   - "closed": the Client is closed.
//   - "canceled" (one l): the call was cancelled through its Cancel
//     handle. The intent keeps its state; an unresolved one is settled
//     later.
//   - "authorizer": the Authorizer failed before any attempt of the call
//     was sent. Once one was, a failure of the Authorizer returns a Result
//     with OutcomeUnknown instead: the payment may have been made.
//   - "internal": anything else, including a message this package did not
//     make.
func ErrorKind(message string) string {
	rest, ok := strings.CutPrefix(message, "idem[")
	if !ok {
		return kindInternal
	}
	kind, _, ok := strings.Cut(rest, "]: ")
	if !ok {
		return kindInternal
	}
	switch kind {
	case kindConfig, kindLocked, kindStorage, kindNotFound, kindClosed, kindCanceled, kindAuthorizer:
		return kind
	}
	return kindInternal
}
