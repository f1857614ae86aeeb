package idem

import (
	"context"
	"net/http"
)

// budgetTransport bounds each attempt of a call by what is left of the
// call's budget. So a server that never answers cannot hold Do past
// RetryPolicy.MaxElapsed. Nor can one that trickles its answer. That holds
// whatever the http.Client's Timeout, and http.DefaultClient has none.
//
// The budget is counted on the Client's Clock. An attempt's I/O runs in real
// time. So the attempt gets the budget left at its start, read on the Clock.
// That is a real-time limit on its context, which covers the body too. With
// the system clock the two agree. A manual clock only moves when waited on.
// The time spent on the wire does not move it. So each attempt gets at most
// what the clock says is left.
type budgetTransport struct{ base http.RoundTripper }

func (t budgetTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, ok := callIn(req.Context())
	base := t.baseTransport()
	if ok && st.authErr != nil {
		// The Authorizer failed, so nothing of this attempt is sent.
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, st.authErr
	}
	if !ok || req.Context().Err() != nil {
		// There is nothing to bound without a call's budget. Nor is there
		// with its context done, for the base transport then fails at once.
		return base.RoundTrip(req)
	}
	limit, reason, err := st.onWire()
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithTimeout(req.Context(), limit)
	sent := req.WithContext(ctx)
	resp, err := base.RoundTrip(sent)
	if err != nil {
		st.noteCut(ctx, req.Context(), reason)
		cancel()
		return nil, err
	}
	if st.cutAtGate() {
		// The gate cut this attempt's body (sendGate). An answer to it is
		// about a request idem broke on purpose, never the intent's.
		resp.Body.Close()
		cancel()
		return nil, errPastSendDeadline
	}
	// The call reads its answer through the request the answer names
	// (call.run). A base transport may name a copy on another context, or
	// none. The answer is still this attempt's. A copy keeps its URL and
	// the redirects that led to it (fromAnotherOrigin reads them).
	if r := resp.Request; r == nil {
		resp.Request = sent
	} else if r != sent {
		if got, ok := callIn(r.Context()); !ok || got != st {
			resp.Request = r.WithContext(ctx)
		}
	}
	resp.Body = st.answerBody(resp.Body, ctx, req.Context(), cancel, reason)
	return resp, nil
}

// CloseIdleConnections closes the base transport's idle connections. It does
// as http.Client.CloseIdleConnections would without the wrapper.
func (t budgetTransport) CloseIdleConnections() {
	if c, ok := t.baseTransport().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// baseTransport is the transport the attempts go through. That is the
// http.Client's, or http.DefaultTransport as net/http would use.
func (t budgetTransport) baseTransport() http.RoundTripper {
	if t.base == nil {
		return http.DefaultTransport
	}
	return t.base
}
