package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"
)

// Sentinel errors. Match them with errors.Is; the typed errors below wrap
// them where they apply.
var (
	// ErrKeyReused: the server said that the key was used with a different
	// request. This is a bug in the caller (a changed request must be a new
	// intent); it is never retried. The answer is recognised by what it
	// says, not by its status alone: a 422 problem of the contract's type
	// (.../idempotency-key-reused), a Stripe error of type
	// idempotency_error, or what Server.KeyReusedAnswer recognises. Any other
	// 422 is an ordinary final answer.
	ErrKeyReused = errors.New("idem: the server saw this Idempotency-Key with a different request; a changed request needs a new intent")

	// ErrNotSent: the request provably never reached the server: no
	// attempt wrote it to a connection (the network was down, the host not
	// found, the connection or the TLS handshake refused, as the client
	// trace shows), or its TLS certificate was refused, the server answered
	// plain HTTP to HTTPS, a redirect pointed to a scheme that is not http
	// or https, redirects went round in a loop. Nothing was done; the
	// error also matches why (a dial error, the certificate's, ...), and
	// not ErrOutcomeUnknown.
	//
	// It is returned only when no attempt of the intent can have reached
	// the server: this Client created the intent and has not sent it, or
	// it was stored not sent, and no attempt of this call wrote its
	// request. The intent is then stored not sent (StateNotSent):
	// Client.Intent replaces it for a changed request, SettleAll leaves
	// it, and Send, Settle or Do send it again when the app asks. When an
	// earlier attempt (or an earlier process) may have reached the
	// server, the same failures end the call with a *RetryError: the
	// outcome is still unknown.
	ErrNotSent = errors.New("idem: the request never reached the server")

	// ErrKeyRejected: the server refused the key itself (400, key missing or
	// malformed, for example not a UUID where the server wants one).
	ErrKeyRejected = errors.New("idem: the server rejected the Idempotency-Key (400)")

	// ErrOutcomeUnknown: the request may or may not have taken effect. The
	// intent stays unresolved: Settle it (or Do it) again later. A Do that
	// sent nothing because it could not read the intent's record (its
	// context ended) matches it too, with the store's error, unless the
	// intent was stored not sent: an earlier attempt may have reached the
	// server.
	ErrOutcomeUnknown = errors.New("idem: outcome unknown: the request may or may not have taken effect")

	// ErrIntentMismatch: a request was offered for an intent that holds a
	// different one. A changed request is a new intent.
	ErrIntentMismatch = errors.New("idem: request differs from the intent's; a changed request is a new intent")

	// ErrIntentReplaced: Client.Intent replaced this never-sent intent with
	// a new one for a changed request; it is never sent.
	ErrIntentReplaced = errors.New("idem: intent was replaced by a new intent for a changed request before it was sent")

	// ErrInFlight: the operation needs the intent to be idle, and a Do for
	// it is running in this process.
	ErrInFlight = errors.New("idem: a request for this intent is in flight")
)

// The reasons a call ends with a *RetryError, as RetryError.Reason gives
// them. With each, the outcome is unknown and the intent stays unresolved
// with its key.
const (
	// stopAttempts: the call made RetryPolicy.MaxAttempts attempts.
	stopAttempts = "max attempts reached"
	// stopElapsed: the next attempt would start after RetryPolicy.MaxElapsed.
	stopElapsed = "max elapsed time reached"
	// stopDeadline: the next attempt would start after the context's
	// deadline, or the deadline passed during an attempt.
	stopDeadline = "context deadline"
	// stopRetryAfterCap: the server asked for a Retry-After longer than
	// RetryPolicy.MaxRetryAfter; RetryError.Wait holds what it asked.
	stopRetryAfterCap = "Retry-After above the cap"
	// stopCanceled: the context was canceled.
	stopCanceled = "context canceled"
	// stopExpired: the intent is older than the server's retention less the
	// safety margin (Server.Retention), or would be by the next attempt: the
	// server may have forgotten its key, and a resend could do the work
	// twice. It is not sent again; Settle asks the server's lookup instead.
	stopExpired = "intent expired"
	// stopFatal: an error that retrying cannot fix, such as an answer over
	// the size limit (Server.MaxResponseBytes), after an attempt that may have
	// reached the server; RetryError.Err holds it.
	stopFatal = "error that retrying cannot fix"
	// stopRedirect: the answer was a 3xx that is not followed (301, 302,
	// an unmarked 303, a login page say): it says nothing about the work.
	// RetryError.LastResponse holds it, with its Location.
	stopRedirect = "redirect not followed"
	// stopUnmarked: a 2xx or 4xx answer that does not show it is the
	// server's (it does not echo the intent's key, is not marked
	// Idempotent-Replayed, and Server.Mark does not recognise it)
	// came after a request of the intent may have reached the server, or
	// was a 2xx: a gateway's 401, a CDN's page, a captive portal's login
	// page. It says nothing about the work, which an earlier request may
	// have done. RetryError.LastResponse holds it; Settle again later.
	stopUnmarked = "answer not marked as the server's"
	// stopRedirectedKeyReused: the server answered that the key was used
	// with another request (ErrKeyReused's answer) after an attempt of
	// the intent was redirected (307 or 308) to another URL. The server
	// fingerprints the URL, path and query, so the redirected request,
	// which may have done the work, is "another request" to it: the
	// answer says nothing about the work. The call does not resend to the
	// URL the redirect named (whoever answered it may not be the server);
	// RetryError.LastResponse holds the 422, and Settle asks the server's
	// lookup what became of the key.
	stopRedirectedKeyReused = "key reuse answer after a redirect to another URL"
	// stopAuthorizer: Config.Authorizer failed before an attempt: no retry
	// can fix it. The call ends not sent if no attempt of the intent
	// wrote its request.
	stopAuthorizer = "the Authorizer failed"
)

// RetryError reports a call that ended without a final answer from the
// server. The outcome is unknown (errors.Is(err, ErrOutcomeUnknown)): the
// intent stays unresolved and keeps its key for the next Do.
type RetryError struct {
	Key string
	// Reason says in words what ended the call (the attempts or the time
	// ran out, the context ended, the intent expired, an answer was not
	// the server's, ...), for logs and messages. Branch on what the error
	// matches instead: ErrOutcomeUnknown always, context.Canceled or
	// context.DeadlineExceeded when the caller's context ended the call
	// (its deadline left no time for the next attempt included), and on
	// the intent's State (persist.StateExpired for an intent too old to
	// send again, which only the lookup can settle, as Settle does).
	Reason   string
	Attempts int           // attempts this call put on the wire
	Elapsed  time.Duration // time this call took
	// Wait is the wait that was needed for the next attempt and refused
	// (the server's Retry-After, or the backoff), or zero.
	Wait time.Duration
	// LastResponse is the last retryable answer (503, 409, ...), or nil if
	// the last attempt got none. It is never a replay (its Replayed is
	// false): an answer the server marks Idempotent-Replayed is final,
	// whatever its status, and ends the call as such.
	LastResponse *Response
	// Err is the last attempt's error (network error, the context's error;
	// for an attempt that the call's time limit cut short, an error that
	// says so and does not match context.DeadlineExceeded), or nil when
	// the last attempt got a response. The URL it names carries no
	// credential, as Attempt.URL does not.
	Err error

	// unreached: Err proves that no request of the call reached the
	// server (see neverReached), and none was read without an answer.
	unreached bool
	// noneWritten: the transport's trace proves that no attempt of the
	// call wrote its request to a connection.
	noneWritten bool
	// afterRedirect: an attempt of the intent was redirected to another URL.
	afterRedirect bool
	// by is the call the app made (Do, Send, Settle, SettleAll, or a
	// request through the RoundTripper), which the text names (forCall).
	by string
}

func (e *RetryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idem: outcome unknown for key %s: gave up after %d attempt(s) in %s: %s", e.Key, e.Attempts, e.Elapsed.Round(time.Millisecond), e.Reason)
	if e.Wait > 0 {
		fmt.Fprintf(&b, " (next attempt needed a wait of %s)", e.Wait)
	}
	switch {
	case e.LastResponse != nil:
		fmt.Fprintf(&b, "; last answer %d %s", e.LastResponse.StatusCode, http.StatusText(e.LastResponse.StatusCode))
	case e.Err != nil:
		fmt.Fprintf(&b, "; last error: %v", e.Err)
	}
	switch e.Reason {
	case stopExpired:
		b.WriteString("; only the server's lookup can tell now: call Settle or Reconcile")
	case stopRedirectedKeyReused:
		b.WriteString(", after a redirect to another URL that may have done the work; settle the intent through the lookup")
	case stopUnmarked:
		b.WriteString(", which may come from a proxy, gateway or portal in front of the server, or from a server that does not mark its answers as Config.Server.Mark says; call Settle again later: it asks the server again, or its lookup")
	case stopRedirect:
		if e.LastResponse != nil && e.LastResponse.Header.Get("Location") != "" {
			// Without the credentials a login page's address may carry.
			fmt.Fprintf(&b, " to %s", redactUserinfo(e.LastResponse.Header.Get("Location"), true))
		}
		fmt.Fprintf(&b, "; fix what redirects (a login, a moved endpoint), then %s, or call Reconcile", e.again(""))
	default:
		fmt.Fprintf(&b, "; %s: it resumes with the same key", e.again(" later"))
	}
	return b.String()
}

// again says how the app makes the call that resumes the intent, when
// (" later", or ""): the call it made, again.
func (e *RetryError) again(when string) string {
	switch e.by {
	case callSend:
		return "call Send again" + when + " with the same name and request"
	case callSettle:
		return "call Settle again" + when
	case callSettleAll:
		return "call SettleAll (or Settle) again" + when
	case callRoundTripper:
		return "send the same request again" + when + " (the same action or Idempotency-Key)"
	}
	return "call Do (or Settle) again" + when
}

// The calls an app makes that end in an error of a call, as forCall names
// them.
const (
	callDo           = "Do"
	callSend         = "Send"
	callSettle       = "Settle"
	callSettleAll    = "SettleAll"
	callRoundTripper = "RoundTripper"
)

// joinType is the type of errors.Join's errors.
var joinType = reflect.TypeOf(errors.Join(errors.New("")))

// forCall returns err as the call by (callDo, callSend, ...) tells it: a
// *RetryError in it, at its top or joined there, names that call as the
// one to make again. The error is copied: a call shared by two callers
// (flights) returns one error to both.
func forCall(err error, by string) error {
	out, _ := renamed(err, by)
	return out
}

func renamed(err error, by string) (error, bool) {
	if e, ok := err.(*RetryError); ok {
		if e.by == by {
			return e, false
		}
		cp := *e
		cp.by = by
		return &cp, true
	}
	if err == nil || reflect.TypeOf(err) != joinType {
		return err, false
	}
	errs := err.(interface{ Unwrap() []error }).Unwrap()
	out := make([]error, len(errs))
	changed := false
	for i, e := range errs {
		var c bool
		out[i], c = renamed(e, by)
		changed = changed || c
	}
	if !changed {
		return err, false
	}
	return errors.Join(out...), true
}

// Unwrap makes the error match ErrOutcomeUnknown and the last attempt's
// error, such as context.Canceled, and context.DeadlineExceeded when the
// context's deadline ended the call; Reason says what ended it.
func (e *RetryError) Unwrap() []error {
	errs := []error{ErrOutcomeUnknown}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.Reason == stopDeadline && !errors.Is(e.Err, context.DeadlineExceeded) {
		errs = append(errs, context.DeadlineExceeded)
	}
	return errs
}

// notSentError is the error of a call whose request provably never
// reached the server (see ErrNotSent). Err says why: a network that was
// down (the dial failed on every attempt, as the client trace proves; the
// network may come back), or a cause no retry can fix (the server's
// certificate, the URL, the redirects).
type notSentError struct {
	Key string
	Err error
	// Attempts is the number of attempts the call began, none of which
	// wrote the request; Reason why the call stopped (a RetryError's
	// reason), or "" when it made none.
	Attempts int
	Reason   string
}

func (e *notSentError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idem: intent %s was not sent: the request never reached the server", e.Key)
	if e.Attempts > 0 || e.Reason != "" {
		fmt.Fprintf(&b, " in %d attempt(s)", e.Attempts)
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " (stopped: %s)", e.Reason)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *notSentError) Unwrap() []error { return []error{ErrNotSent, e.Err} }

// SaveError reports that the device store failed a write, or a read that
// Client.Intent needs before it writes. When it comes from Client.Intent or
// Client.NewIntent, nothing was created or sent. When it comes after an
// answer, Do returns the answer too: the server keeps it, and the next Do
// replays it.
//
// A write that makes an intent sendable (arming it, Op "arm", or taking
// it out of not sent, Op "send again" or "take over") may have landed
// though it failed: a disk's sync can fail after the record is complete.
// Such an error matches ErrOutcomeUnknown. Nothing was sent by this call,
// but the intent may be settled, and so sent, by a later start.
type SaveError struct {
	Key string // empty when no intent was concerned yet
	// Op is the step that failed: "arm", "read the action's intents",
	// "drop unsent", "record outcome", "record attempts", ...
	Op  string
	Err error
	// mayHaveLanded: the write may have made the intent sendable.
	mayHaveLanded bool
}

// Is reports a write that may have made the intent sendable as
// ErrOutcomeUnknown.
func (e *SaveError) Is(target error) bool { return target == ErrOutcomeUnknown && e.mayHaveLanded }

func (e *SaveError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("idem: the intent store failed (%s): %v", e.Op, e.Err)
	}
	return fmt.Sprintf("idem: could not save intent %s (%s): %v", e.Key, e.Op, e.Err)
}

func (e *SaveError) Unwrap() error { return e.Err }

// redirectSchemeError ends a redirect to a Location whose scheme net/http
// cannot send to.
type redirectSchemeError struct{ location string }

// errRedirectLoop ends a chain of redirects that does not end: no server
// that does the work answered, so the request never reached it.
var errRedirectLoop = errors.New("idem: stopped after 10 redirects")

// budgetSpent is the error of an attempt, or a lookup, that the call's
// time limit cut short: RetryPolicy.MaxElapsed, the intent's expiry or
// the caller's deadline (reason says which). It says so, and, having no
// Unwrap, does not match the context.DeadlineExceeded of the limit that
// cut it: a *RetryError matches context.DeadlineExceeded only when the
// caller's own context ended the call.
type budgetSpent struct {
	reason string
	err    error
}

func (e *budgetSpent) Error() string {
	return "idem: the attempt was cut short (" + e.reason + "): " + e.err.Error()
}
