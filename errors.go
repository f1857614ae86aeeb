package idem

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/idemkit/idem/persist"
)

// Sentinel errors. Match them with errors.Is. The typed errors below wrap
// them where they apply.
var (
	// ErrKeyReused means the server saw the key with a different request.
	// That is a bug in the caller, since a changed request must be a new
	// intent. It is never retried. The answer is recognised by what it
	// says, not by its status alone. It may be a 422 problem of the
	// contract's type (.../idempotency-key-reused). It may be a Stripe
	// error of type idempotency_error. Or Server.KeyReusedAnswer may
	// recognise it. Any other 422 is an ordinary final answer.
	ErrKeyReused = errors.New("idem: the server saw this Idempotency-Key with a different request; a changed request needs a new intent")

	// ErrNotSent means the request provably never reached the server.
	// Either no attempt wrote it to a connection, as the client trace
	// shows. The network was down, the host not found, or the connection
	// or the TLS handshake refused. Or a cause showed that no server that
	// does the work was reached. Its TLS certificate was refused, or the
	// server answered plain HTTP to HTTPS. A redirect pointed to a scheme
	// that is not http or https, or redirects went round in a loop.
	// Nothing was done. The error also matches why, such as a dial error
	// or the certificate's. It does not match ErrOutcomeUnknown.
	//
	// It is returned only when no attempt of the intent can have reached
	// the server. This Client created the intent and has not sent it, or
	// it was stored not sent. And no attempt of this call wrote its
	// request. The intent is then stored not sent (StateNotSent).
	// Client.Intent replaces it for a changed request, and SettleAll
	// leaves it. Send, Settle or Do send it again when the app asks. An
	// earlier attempt, or an earlier process, may have reached the server.
	// Then the same failures end the call with a *RetryError, since the
	// outcome is still unknown.
	ErrNotSent = errors.New("idem: the request never reached the server")

	// ErrKeyRejected means the server refused the key itself with a 400.
	// The key was missing or malformed, such as not a UUID where the
	// server wants one.
	ErrKeyRejected = errors.New("idem: the server rejected the Idempotency-Key (400)")

	// ErrOutcomeUnknown means the request may or may not have taken
	// effect. The intent stays unresolved, so Settle it (or Do it) again
	// later. A Do may send nothing because it could not read the intent's
	// record, when its context ended. Its error matches ErrOutcomeUnknown
	// too, with the store's error, since an earlier attempt may have
	// reached the server. An intent stored not sent is the exception.
	ErrOutcomeUnknown = errors.New("idem: outcome unknown: the request may or may not have taken effect")

	// ErrIntentMismatch means a request was offered for an intent that
	// holds a different one. A changed request is a new intent.
	ErrIntentMismatch = errors.New("idem: request differs from the intent's; a changed request is a new intent")

	// ErrIntentReplaced means Client.Intent replaced this never-sent intent
	// with a new one for a changed request. The replaced one is never
	// sent.
	ErrIntentReplaced = errors.New("idem: intent was replaced by a new intent for a changed request before it was sent")
)

// The reasons a call ends with a *RetryError, as RetryError.Reason gives
// them. With each, the outcome is unknown. The intent stays unresolved
// with its key.
const (
	// stopAttempts: the call made RetryPolicy.MaxAttempts attempts.
	stopAttempts = "max attempts reached"
	// stopElapsed: the next attempt would start after RetryPolicy.MaxElapsed.
	stopElapsed = "max elapsed time reached"
	// stopDeadline: the next attempt would start after the context's
	// deadline. Or the deadline passed during an attempt.
	stopDeadline = "context deadline"
	// stopRetryAfterCap: the server asked for a Retry-After longer than
	// RetryPolicy.MaxRetryAfter. RetryError.Wait holds what it asked.
	stopRetryAfterCap = "Retry-After above the cap"
	// stopCanceled: the context was canceled.
	stopCanceled = "context canceled"
	// stopExpired: the intent is older than the server's retention less
	// the safety margin (Server.Retention). Or it would be by the next
	// attempt. The server may have forgotten its key, and a resend could
	// do the work twice. So it is not sent again. Settle asks the server's
	// lookup instead.
	stopExpired = "intent expired"
	// stopFatal: an error that retrying cannot fix came after an attempt
	// that may have reached the server. An answer over the size limit
	// (Server.MaxResponseBytes) is one. RetryError.Err holds it.
	stopFatal = "error that retrying cannot fix"
	// stopRedirect: the answer was a 3xx that is not followed. It may be a
	// 301, a 302 or an unmarked 303, to a login page say. It says nothing
	// about the work. RetryError.LastResponse holds it, with its Location.
	stopRedirect = "redirect not followed"
	// stopUnmarked: a 2xx or 4xx answer does not show it is the server's.
	// It does not echo the intent's key, and it is not marked
	// Idempotent-Replayed. Server.Mark does not recognise it either. It is
	// a 2xx, or it came after a request of the intent may have reached
	// the server. A gateway's 401, a CDN's page or a captive portal's
	// login page are such answers. It says nothing about the work, which
	// an earlier request may have done. RetryError.LastResponse holds it.
	// Settle again later.
	stopUnmarked = "answer not marked as the server's"
	// stopRedirectedKeyReused: the server answered ErrKeyReused's answer
	// after an attempt was redirected (307 or 308) to another URL. The
	// server fingerprints the URL, path and query. So the redirected
	// request is "another request" to it, and it may have done the work.
	// The answer says nothing about the work. The call does not resend to
	// the URL the redirect named, since whoever answered it may not be the
	// server. RetryError.LastResponse holds the 422. Settle asks the
	// server's lookup what became of the key.
	stopRedirectedKeyReused = "key reuse answer after a redirect to another URL"
	// stopAuthorizer: Config.Authorizer failed before an attempt. No retry
	// can fix it. The call ends not sent if no attempt of the intent
	// wrote its request.
	stopAuthorizer = "the Authorizer failed"
)

// RetryError reports a call that ended without a final answer from the
// server. The outcome is unknown (errors.Is(err, ErrOutcomeUnknown)). The
// intent stays unresolved and keeps its key for the next Do.
type RetryError struct {
	Key string
	// Reason says in words what ended the call, for logs and messages.
	// The attempts or the time ran out, the context ended, the intent
	// expired, or an answer was not the server's. Branch on what the error
	// matches instead. It always matches ErrOutcomeUnknown. It matches
	// context.Canceled or context.DeadlineExceeded when the caller's
	// context ended the call. That includes a deadline that left no time
	// for the next attempt. Branch on the intent's State too. An intent
	// too old to send again reads persist.StateExpired. Only the lookup
	// can settle it, as Settle does.
	Reason   string
	Attempts int           // attempts this call put on the wire
	Elapsed  time.Duration // time this call took
	// Wait is the wait the next attempt needed, which was refused. It is
	// the server's Retry-After or the backoff, or zero.
	Wait time.Duration
	// LastResponse is the last retryable answer, such as a 503 or a 409.
	// It is nil if the last attempt got none. It is never a replay, so its
	// Replayed is false. An answer the server marks Idempotent-Replayed is
	// final whatever its status, and ends the call as such.
	LastResponse *Response
	// Err is the last attempt's error, such as a network error or the
	// context's. It is nil when the last attempt got a response. The
	// call's time limit may cut an attempt short. Then Err says so, and
	// does not match context.DeadlineExceeded. The URL it names carries no
	// credential, as Attempt.URL does not.
	Err error

	// unreached: Err proves that no request of the call reached the
	// server (see neverReached). And none was read without an answer.
	unreached bool
	// noneWritten: the transport's trace proves that no attempt of the
	// call wrote its request to a connection.
	noneWritten bool
	// stopped: Err is only the call's signal to stop (errStopped). It is
	// no attempt's error.
	stopped bool
	// afterRedirect: an attempt of the intent was redirected to another URL.
	afterRedirect bool
	// by is the call the app made, which the text names (forCall). It is
	// Do, Send, Settle, SettleAll, or a request through the RoundTripper.
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

// again says how the app makes the call that resumes the intent. That is
// the call it made, again. when is " later" or "".
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

// forCall returns err as the call by (callDo, callSend, ...) tells it. A
// *RetryError in it, at its top or joined there, names that call as the
// one to make again. The error is copied, since a call shared by two
// callers (flights) returns one error to both.
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

// Unwrap makes the error match ErrOutcomeUnknown. It matches the last
// attempt's error too, such as context.Canceled. It matches
// context.DeadlineExceeded when the context's deadline ended the call.
// Reason says what ended it.
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
// reached the server (see ErrNotSent). Err says why. The network may have
// been down, and may come back. Then the dial failed on every attempt, as
// the client trace proves. Or no retry can fix the cause. The server's
// certificate, the URL or the redirects are such causes.
type notSentError struct {
	Key string
	Err error
	// Attempts is the number of attempts the call began. None of them
	// wrote the request. Reason is why the call stopped, as a RetryError's
	// reason. It is "" when the call made no attempt.
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

// errLeftUnsent is why SettleAll does not send an intent that ended not
// sent.
var errLeftUnsent = errors.New("idem: the intent ended not sent; it is sent again only when the app asks (Send, Settle or Do)")

// SaveError reports that the device store failed a write. Or it failed a
// read that Client.Intent needs before it writes. From Client.Intent or
// Client.NewIntent, it means nothing was created or sent. After an answer,
// Do returns the answer too. The server keeps it, and the next Do replays
// it.
//
// Some writes make an intent sendable. Arming it is one (Op "arm"). Taking
// it out of not sent is another (Op "send again" or "take over"). Such a
// write may have landed though it failed. A disk's sync can fail after
// the record is complete. So such an error matches ErrOutcomeUnknown. This
// call sent nothing. But a later start may settle the intent, and so send
// it.
type SaveError struct {
	Key string // empty when no intent was concerned yet
	// Op is the step that failed, such as "arm", "drop unsent" or "record
	// outcome".
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

func (e *redirectSchemeError) Error() string {
	return fmt.Sprintf("idem: redirected to %s, whose scheme is not http or https", e.location)
}

// errRedirectLoop ends a chain of redirects that does not end. No server
// that does the work answered, so the request never reached it.
var errRedirectLoop = errors.New("idem: stopped after 10 redirects")

// budgetSpent is the error of an attempt, or a lookup, that the call's
// time limit cut short. The limit is RetryPolicy.MaxElapsed, the intent's
// expiry or the caller's deadline, and reason says which. It has no
// Unwrap. So it does not match the context.DeadlineExceeded of the limit
// that cut it. A *RetryError matches context.DeadlineExceeded only when
// the caller's own context ended the call.
type budgetSpent struct {
	reason string
	err    error
}

func (e *budgetSpent) Error() string {
	return "idem: the attempt was cut short (" + e.reason + "): " + e.err.Error()
}

// APIError is a final answer from the server that is not a success. It is a
// business outcome such as 402 (card declined). Or it is a validation 400,
// or a key error (400, 422). It is returned together with the Response.
type APIError struct {
	Method string
	// URL is the request's URL as the app gave it. The error's text names it
	// without credentials, as Attempt.URL does. Credentials are the user
	// name, password, and the values of query parameters named for
	// credentials.
	URL        string
	Key        string
	StatusCode int
	// Problem holds the RFC 9457 fields when the body was a problem
	// document. That is application/problem+json, or JSON with those fields.
	Problem struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}
	// Response is the whole answer, body included.
	Response *Response

	keyReused bool // the answer says the key was used with another request
}

func (e *APIError) Error() string {
	var b strings.Builder
	// The text, which apps log, names the URL without its credentials.
	fmt.Fprintf(&b, "idem: %s %s answered %d %s", e.Method, redactUserinfo(e.URL, true), e.StatusCode, http.StatusText(e.StatusCode))
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

// Is makes errors.Is(err, ErrKeyReused) true for the answers that mean it.
// It does the same for ErrKeyRejected.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrKeyReused:
		return e.keyReused
	case ErrKeyRejected:
		return isKeyProblem(e.StatusCode, e.Problem.Type)
	}
	return false
}

func (c *answerRules) apiErrorFor(rec *persist.Record, resp *Response) error {
	if done(resp.StatusCode) {
		return nil
	}
	return &APIError{
		Method:     rec.Method,
		URL:        rec.URL,
		Key:        rec.Key,
		StatusCode: resp.StatusCode,
		Problem:    parseProblem(resp.Header, resp.Body),
		Response:   resp,
		keyReused:  c.keyReused(resp.StatusCode, resp.Header, resp.Body),
	}
}

// retryableError reports whether a transport error may be retried. Every
// network failure may be, even after the request was written. The key makes
// the repeat harmless. An oversized answer may not be retried. Nor may an
// error that proves the request never reached the server (neverReached). No
// retry will fix those. Errors are classified by type, never by message
// text.
func retryableError(err error) bool {
	return !errors.Is(err, errBodyTooLarge) && !neverReached(err)
}

// neverReached reports an error that proves the request was never written to
// a server that does the work. These errors prove it:
//
//   - A certificate refused: unknown authority, wrong hostname, invalid. The
//     TLS handshake failed, and the request is written only after it.
//   - A plain HTTP answer to the TLS handshake (http.ErrSchemeMismatch).
//   - A redirect to a scheme net/http cannot send to, or a redirect loop.
//     Only servers that answered 307 or 308 saw the request.
//
// It speaks of the last try only. net/http may have written the same request
// on a reused connection first. (See call.mayHaveReached.)
func neverReached(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verify           *tls.CertificateVerificationError
		scheme           *redirectSchemeError
	)
	switch {
	case errors.As(err, &unknownAuthority), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &verify),
		errors.Is(err, http.ErrSchemeMismatch),
		errors.As(err, &scheme), errors.Is(err, errRedirectLoop):
		return true
	}
	return false
}
