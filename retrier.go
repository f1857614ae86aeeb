package idem

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// The retrier is idem's adapter of go-retryablehttp, the loop that sends a
// call's attempts, and the one file that knows of it. It bends the
// library where the library cannot keep idem's promises:
//
//   - Waits must run on the Client's injectable clock (Config.Clock) and end
//     with the call's context, while retryablehttp waits on time.NewTimer
//     and its Backoff sees no context. So Backoff returns zero and the
//     wait happens in CheckRetry, where the call's decision is made
//     (call.afterAttempt, from the budget of retry.go, which computes the
//     backoff with cenkalti/backoff on the same clock).
//   - The budget, not a count, ends a call: RetryMax is unbounded.
//   - The hooks see the call's state through the request's context (a
//     retryablehttp.Client is shared by every call), and ErrorHandler
//     keeps the last answer, which retryablehttp would drop.
//   - Logger stays nil: retryablehttp's own lines ("request failed" at
//     ERROR for an answer idem retries, its count of remaining retries)
//     speak of its loop, not of the intent. The app's logger hears idem's
//     lines only: one per attempt and one per outcome.
//
// What it does use as it is: the request's rewindable body, the response
// handler that reads a final answer inside the loop, and the loop itself.

// retrier sends the attempts of calls through one http.Client.
type retrier struct{ rc *retryablehttp.Client }

// newRetrier returns the retrier that sends through hc, following only
// the redirects that keep the request (redirectPolicy) and bounding each
// attempt by the call's budget (budgetTransport). It is made once per
// http.Client and shared by all calls.
func newRetrier(hc *http.Client) *retrier {
	hc = redirectPolicy(hc)
	hc.Transport = budgetTransport{base: hc.Transport}
	return &retrier{rc: &retryablehttp.Client{
		HTTPClient: hc,
		RetryMax:   math.MaxInt32, // the budget decides
		RequestLogHook: func(_ retryablehttp.Logger, req *http.Request, _ int) {
			st := callOf(req.Context())
			st.attemptStarted(req.Context())
			// A fresh nonce per attempt, which no server echoes: an answer
			// that carries it is a reflection (see reflected).
			req.Header[attemptNonceHeader] = attemptNonce()
			st.authorize(req)
		},
		CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			return callOf(ctx).afterAttempt(ctx, resp, err)
		},
		Backoff: func(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 },
		ErrorHandler: func(resp *http.Response, err error, _ int) (*http.Response, error) {
			if resp == nil {
				return nil, err
			}
			return callOf(resp.Request.Context()).keepLast(resp, err)
		},
	}}
}

// run sends one call's request, and again as the call decides. ctx
// carries the call (call.withTrace).
func (r *retrier) run(ctx context.Context, method, url string, body []byte, header http.Header) (*http.Response, error) {
	st := callOf(ctx)
	// The body is rewound for every attempt from a fresh reader over the
	// same bytes. retryablehttp asks for one reader to learn the length
	// and closes it unread, then one per attempt: the first two are the
	// reader the call holds, read by one at a time, which saves their
	// allocations; each retry gets its own, since net/http may still be
	// closing the last attempt's. A *bytes.Reader, which retryablehttp
	// wraps in an io.NopCloser: net/http knows that body to be in memory
	// and writes the request's head and body together.
	bodyFunc := retryablehttp.ReaderFunc(func() (io.Reader, error) {
		st.bodies++
		if st.bodies <= 2 {
			st.firstBody.Reset(body)
			return &st.firstBody, nil
		}
		return bytes.NewReader(body), nil
	})
	req, err := retryablehttp.NewRequestWithContext(ctx, method, url, bodyFunc)
	if err != nil {
		return nil, err
	}
	req.Header = header
	req.SetResponseHandler(func(resp *http.Response) error { return callOf(resp.Request.Context()).readFinal(resp) })
	return r.rc.Do(req)
}
