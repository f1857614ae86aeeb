package idem

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// Sentinel errors. Match them with errors.Is; the typed errors below wrap
// them where they apply.
var (
	// ErrKeyReused: the server said that the key was used with a different
	// request. This is a bug in the caller (a changed request must be a new
	// intent); it is never retried. The answer is recognised by what it
	// says, not by its status alone: a 422 problem of the contract's type
	// (.../idempotency-key-reused), a Stripe error of type
	// idempotency_error, or what WithKeyReusedAnswer recognises. Any other
	// 422 is an ordinary final answer.
	ErrKeyReused = errors.New("idem: the server saw this Idempotency-Key with a different request; a changed request needs a new intent")

	// ErrNotSent: the request provably never reached the server: no
	// attempt wrote it to a connection (the network was down, the host not
	// found, the connection or the TLS handshake refused, as the client
	// trace shows), or its TLS certificate was refused, the server answered
	// plain HTTP to HTTPS, a redirect pointed to a scheme that is not http
	// or https, redirects went round in a loop. Nothing was done. See
	// NotSentError.
	ErrNotSent = errors.New("idem: the request never reached the server")

	// ErrKeyRejected: the server refused the key itself (400, key missing or
	// malformed, for example not a UUID where the server wants one).
	ErrKeyRejected = errors.New("idem: the server rejected the Idempotency-Key (400)")

	// ErrOutcomeUnknown: the request may or may not have taken effect. The
	// intent stays unresolved: Settle it (or Do it) again later.
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

// APIError is a final answer from the server that is not a success: a
// business outcome such as 402 (card declined), a validation 400, a key
// error (400, 422). It is returned together with the Response.
type APIError struct {
	Method     string
	URL        string
	Key        string
	StatusCode int
	// Problem holds the RFC 9457 fields when the body was a problem
	// document (application/problem+json or JSON with those fields).
	Problem idempotency.Problem
	// Response is the whole answer, body included.
	Response *Response

	keyReused bool // the answer says the key was used with another request
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idem: %s %s answered %d %s", e.Method, e.URL, e.StatusCode, http.StatusText(e.StatusCode))
	if t := problemName(e.Problem.Type); t != "" {
		fmt.Fprintf(&b, " (%s)", t)
	}
	if e.Problem.Detail != "" {
		fmt.Fprintf(&b, ": %s", e.Problem.Detail)
	} else if e.Problem.Title != "" {
		fmt.Fprintf(&b, ": %s", e.Problem.Title)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " [key %s]", e.Key)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrKeyReused) and errors.Is(err, ErrKeyRejected)
// true for the answers that mean them.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrKeyReused:
		return e.keyReused
	case ErrKeyRejected:
		return isKeyProblem(e.StatusCode, e.Problem.Type)
	}
	return false
}

// problemName is the last path segment of a problem type URI, the part that
// names the problem ("idempotency-key-reused").
func problemName(typ string) string {
	typ = strings.TrimRight(typ, "/")
	if i := strings.LastIndexByte(typ, '/'); i >= 0 {
		return typ[i+1:]
	}
	return typ
}

// isKeyProblem reports a 400 about the Idempotency-Key itself. The contract
// names these problem types; a server that sends no problem type gives no
// way to tell, and its 400 is treated as an ordinary final answer.
func isKeyProblem(status int, typ string) bool {
	if status != http.StatusBadRequest {
		return false
	}
	switch problemName(typ) {
	case "idempotency-key-missing", "idempotency-key-invalid":
		return true
	}
	return false
}

// isKeyReused reports an answer that says the key was used with another
// request, by what it says: the contract's problem type on a 422, or
// Stripe's JSON error of type idempotency_error (which Stripe sends with
// 400). A 422 without either is an ordinary final answer: many APIs use it
// for plain validation.
func isKeyReused(status int, header http.Header, body []byte) bool {
	switch status {
	case http.StatusUnprocessableEntity:
		if problemName(parseProblem(header, body).Type) == "idempotency-key-reused" {
			return true
		}
		fallthrough
	case http.StatusBadRequest:
		return isStripeIdempotencyError(header, body)
	}
	return false
}

// isStripeIdempotencyError reports Stripe's error body
// {"error": {"type": "idempotency_error", ...}}.
func isStripeIdempotencyError(header http.Header, body []byte) bool {
	ct, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if ct != "application/json" {
		return false
	}
	var e struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &e) == nil && e.Error.Type == "idempotency_error"
}

// parseProblem decodes an RFC 9457 body; anything else yields the zero
// problem. It never fails: a server that answers nonsense still gets its
// status reported.
func parseProblem(header http.Header, body []byte) idempotency.Problem {
	ct, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if ct != "application/problem+json" && ct != "application/json" {
		return idempotency.Problem{}
	}
	var p idempotency.Problem
	if json.Unmarshal(body, &p) != nil {
		return idempotency.Problem{}
	}
	return p
}

// StopReason says what ended a call without a final answer.
type StopReason string

// The reasons a call ends with a *RetryError. With each, the outcome is
// unknown and the intent stays unresolved with its key.
const (
	// StopAttempts: the call made RetryPolicy.MaxAttempts attempts.
	StopAttempts StopReason = "max attempts reached"
	// StopElapsed: the next attempt would start after RetryPolicy.MaxElapsed.
	StopElapsed StopReason = "max elapsed time reached"
	// StopDeadline: the next attempt would start after the context's
	// deadline, or the deadline passed during an attempt.
	StopDeadline StopReason = "context deadline"
	// StopRetryAfterCap: the server asked for a Retry-After longer than
	// RetryPolicy.MaxRetryAfter; RetryError.Wait holds what it asked.
	StopRetryAfterCap StopReason = "Retry-After above the cap"
	// StopCanceled: the context was canceled.
	StopCanceled StopReason = "context canceled"
	// StopExpired: the intent is older than the server's retention less the
	// safety margin (WithRetention), or would be by the next attempt: the
	// server may have forgotten its key, and a resend could do the work
	// twice. It is not sent again; Settle asks the server's lookup instead.
	StopExpired StopReason = "intent expired"
	// StopFatal: an error that retrying cannot fix, such as an answer over
	// the size limit (WithMaxResponseBytes), after an attempt that may have
	// reached the server; RetryError.Err holds it.
	StopFatal StopReason = "error that retrying cannot fix"
	// StopRedirect: the answer was a 3xx that is not followed (301, 302 or
	// 303 to a GET, a login page say): it says nothing about the work.
	// RetryError.LastResponse holds it, with its Location.
	StopRedirect StopReason = "redirect not followed"
	// StopUnmarked: a 2xx or 4xx answer that does not show it is the
	// server's (it does not echo the intent's key, is not marked
	// Idempotent-Replayed, and WithServerAnswer does not recognise it)
	// came after a request of the intent may have reached the server, or
	// was a 2xx: a gateway's 401, a CDN's page, a captive portal's login
	// page. It says nothing about the work, which an earlier request may
	// have done. RetryError.LastResponse holds it; Settle again later.
	StopUnmarked StopReason = "answer not marked as the server's"
	// StopRedirectedKeyReused: the server answered that the key was used
	// with another request (ErrKeyReused's answer) after an attempt of
	// the intent was redirected (307 or 308) to another URL. The server
	// fingerprints the URL, path and query, so the redirected request,
	// which may have done the work, is "another request" to it: the
	// answer says nothing about the work. The call does not resend to the
	// URL the redirect named (whoever answered it may not be the server);
	// RetryError.LastResponse holds the 422, and Settle asks the server's
	// lookup what became of the key.
	StopRedirectedKeyReused StopReason = "key reuse answer after a redirect to another URL"
)

// RetryError reports a call that ended without a final answer from the
// server. The outcome is unknown (errors.Is(err, ErrOutcomeUnknown)): the
// intent stays unresolved and keeps its key for the next Do.
type RetryError struct {
	Key      string
	Reason   StopReason
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
	// Err is the last attempt's error (network error, the context's error),
	// or nil when the last attempt got a response.
	Err error

	// neverReached: Err proves that no request of the call reached the
	// server (see neverReached), and none was read without an answer.
	neverReached bool
	// sentNothing: the transport's trace proves that no attempt of the
	// call wrote its request to a connection.
	sentNothing bool
	// redirected: an attempt of the intent was redirected to another URL.
	redirected bool
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
	case StopExpired:
		b.WriteString("; reconcile the intent")
	case StopRedirectedKeyReused:
		b.WriteString(", after a redirect to another URL that may have done the work; settle the intent through the lookup")
	case StopUnmarked:
		b.WriteString(", which may come from a proxy, gateway or portal in front of the server; settle the intent again later")
	case StopRedirect:
		if e.LastResponse != nil && e.LastResponse.Header.Get("Location") != "" {
			fmt.Fprintf(&b, " to %s", e.LastResponse.Header.Get("Location"))
		}
		b.WriteString("; fix what redirects (a login, a moved endpoint), then Do again or reconcile the intent")
	default:
		b.WriteString("; call Do again later to resume with the same key")
	}
	return b.String()
}

// Unwrap makes the error match ErrOutcomeUnknown and the last attempt's
// error, such as context.Canceled; Reason says what ended the call.
func (e *RetryError) Unwrap() []error {
	errs := []error{ErrOutcomeUnknown}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// NotSentError reports a call whose request provably never reached the
// server: nothing was done. Err says why: a network that was down (the
// dial failed on every attempt, as the client trace proves; the network
// may come back), or a cause no retry can fix (the server's certificate,
// the URL, the redirects). It matches ErrNotSent and not
// ErrOutcomeUnknown.
//
// It is returned only when no attempt of the intent can have reached the
// server: this Client created the intent and has not sent it, or it was
// stored not sent, and no attempt of this call wrote its request. The
// intent is stored not sent (StateNotSent): Client.Intent replaces it for
// a changed request, SettleAll leaves it, and Send, Settle or Do send it
// again when the app asks. When an earlier attempt (or an earlier
// process) may have reached the server, the same failures end the call
// with a *RetryError: the outcome is still unknown.
type NotSentError struct {
	Key string
	Err error
}

func (e *NotSentError) Error() string {
	return fmt.Sprintf("idem: intent %s was not sent: the request never reached the server: %v", e.Key, e.Err)
}

func (e *NotSentError) Unwrap() []error { return []error{ErrNotSent, e.Err} }

// UnresolvedError is returned when a new intent is asked for an action
// whose previous intent has an unknown outcome (match it with errors.As).
// Starting a second payment then could pay twice. The app decides: settle
// Previous with Client.Settle (it may still complete, for the old request),
// or, knowingly, drop it with Client.Forget.
type UnresolvedError struct {
	Name     string
	Previous *Intent
}

func (e *UnresolvedError) Error() string {
	return fmt.Sprintf("idem: intent %s for %q has an unknown outcome (%s); resume, reconcile or forget it before starting another", e.Previous.Key(), e.Name, e.Previous.State())
}

// ResolvedError is returned when an intent is asked for an action whose
// latest intent succeeded, with a request other than that intent's (a
// changed amount, or the same server spelled another way): the action is
// paid, and a new intent could pay it twice. Previous holds the earlier
// intent and Response its stored answer. A deliberate second payment for
// the action is Client.NewIntent.
type ResolvedError struct {
	Name     string
	Previous *Intent
}

// Response returns the earlier intent's stored answer.
func (e *ResolvedError) Response() *Response { return e.Previous.Response() }

func (e *ResolvedError) Error() string {
	return fmt.Sprintf("idem: %q was already paid by intent %s with another request; nothing was sent (use NewIntent for a deliberate second payment)", e.Name, e.Previous.Key())
}

// SaveError reports that the device store failed a write, or a read that
// Client.Intent needs before it writes. When it comes from Client.Intent or
// Client.NewIntent, or from the arming write of Do (Op "arm"), nothing was
// created or sent. When it comes after an
// answer, Do returns the answer too: the server keeps it, and the next Do
// replays it.
type SaveError struct {
	Key string // empty when no intent was concerned yet
	// Op is the step that failed: "arm", "read the action's intents",
	// "drop unsent", "record outcome", "record attempts", ...
	Op  string
	Err error
}

func (e *SaveError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("idem: the intent store failed (%s): %v", e.Op, e.Err)
	}
	return fmt.Sprintf("idem: could not save intent %s (%s): %v", e.Key, e.Op, e.Err)
}

func (e *SaveError) Unwrap() error { return e.Err }
