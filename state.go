package idem

import (
	"strconv"

	"github.com/idemkit/idem/persist"
)

// State is where an intent stands, as Intent.State reports it.
type State uint8

// The states of an intent. Succeeded, Failed, Rejected and Void are
// resolved: the outcome is known and never changes.
const (
	// StateNew: saved, no attempt is known to have been sent. After a crash
	// a new intent may have been sent: resuming it is safe, with its key.
	StateNew State = iota + 1
	// StatePending: an attempt may have reached the server and the outcome
	// is unknown: Settle it, or Do it again.
	StatePending
	// StateSucceeded: the server answered 2xx.
	StateSucceeded
	// StateFailed: the server gave a final answer that is not a success,
	// such as 402 for a declined card.
	StateFailed
	// StateRejected: the server refused the key (422 reused, 400 about the
	// key).
	StateRejected
	// StateExpired: the outcome is unknown and the intent is too old to be
	// sent again; only the server's lookup can settle it.
	StateExpired
	// StateVoid: the server's lookup showed it never did the work; a new
	// intent for the action may be created.
	StateVoid
	// StateNotSent: the last call of the intent wrote no request to any
	// connection (the network was down, the host unknown, the connection
	// or the certificate refused), and no earlier call can have: the
	// server never saw it. It is not resolved, but nothing sends it again
	// unless the app asks (Send, Settle, Do; SettleAll leaves it), and a
	// changed request replaces it (Client.Intent).
	StateNotSent
)

var stateNames = [...]string{
	StateNew:       "new",
	StatePending:   "pending",
	StateSucceeded: "succeeded",
	StateFailed:    "failed",
	StateRejected:  "rejected",
	StateExpired:   "expired",
	StateVoid:      "void",
	StateNotSent:   "not_sent",
}

// String returns the state's name: "new", "pending", "succeeded", "failed",
// "rejected", "expired", "void" or "not_sent".
func (s State) String() string {
	if s >= StateNew && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Resolved reports whether the outcome is known: succeeded, failed,
// rejected or void.
func (s State) Resolved() bool {
	switch s {
	case StateSucceeded, StateFailed, StateRejected, StateVoid:
		return true
	}
	return false
}

// stateOf maps the store's representation to the client's.
func stateOf(s persist.State) State {
	switch s {
	case persist.StateNew:
		return StateNew
	case persist.StatePending:
		return StatePending
	case persist.StateSucceeded:
		return StateSucceeded
	case persist.StateFailed:
		return StateFailed
	case persist.StateRejected:
		return StateRejected
	case persist.StateExpired:
		return StateExpired
	case persist.StateVoid:
		return StateVoid
	case persist.StateNotSent:
		return StateNotSent
	}
	return 0
}
