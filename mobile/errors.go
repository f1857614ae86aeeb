package mobile

import "strings"

// The kinds of device errors. An error's message starts with
// "idem[kind]: ".
const (
	// KindConfig: the Config or an argument is wrong.
	KindConfig = "config"
	// KindLocked: the state directory is in use by another Client, in
	// this process or another. Close it first.
	KindLocked = "locked"
	// KindStorage: the device could not read or write the state directory
	// (full, read-only, damaged). Nothing was sent.
	KindStorage = "storage"
	// KindNotFound: no intent has that key on this device.
	KindNotFound = "not-found"
	// KindClosed: the Client is closed.
	KindClosed = "closed"
	// KindCanceled: the call was cancelled through its Cancel handle. The
	// intent keeps its state; an unresolved one is settled later.
	KindCanceled = "canceled"
	// KindAuthorizer: the Authorizer failed before any attempt of the
	// call was sent. Once one was, a failure of the Authorizer returns a
	// Result with OutcomeUnknown instead: the payment may have been made.
	KindAuthorizer = "authorizer"
	// KindInternal: anything else.
	KindInternal = "internal"
)

// deviceErr is a device error with its kind.
type deviceErr struct {
	Kind    string
	Message string
}

func newError(kind, msg string) *deviceErr { return &deviceErr{Kind: kind, Message: msg} }

func (e *deviceErr) Error() string { return "idem[" + e.Kind + "]: " + e.Message }

// ErrorKind returns the kind of an error message that this package made,
// such as KindLocked, or KindInternal for any other message. Pass it the
// exception's message (Java: e.getMessage(); Swift: error.localizedDescription).
func ErrorKind(message string) string {
	rest, ok := strings.CutPrefix(message, "idem[")
	if !ok {
		return KindInternal
	}
	kind, _, ok := strings.Cut(rest, "]: ")
	if !ok {
		return KindInternal
	}
	switch kind {
	case KindConfig, KindLocked, KindStorage, KindNotFound, KindClosed, KindCanceled, KindAuthorizer:
		return kind
	}
	return KindInternal
}
