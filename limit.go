package idem

import (
	"context"
	"io"
	"net/http"
)

// budgetTransport bounds each attempt of a call by what is left of the
// call's budget, so that a server that never answers, or trickles its
// answer, cannot hold Do past RetryPolicy.MaxElapsed whatever the
// http.Client's Timeout (none, for http.DefaultClient).
//
// The budget is counted on the Client's Clock, and an attempt's I/O runs in
// real time: the attempt is given the budget left at its start, as read on
// the Clock, as a real-time limit on its context, which covers the body
// too. With the system clock the two agree. With a manual clock that only
// moves when waited on, the time spent on the wire does not move it, and
// each attempt gets at most what the clock says is left.
type budgetTransport struct{ base http.RoundTripper }

func (t budgetTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, ok := callIn(req.Context())
	base := t.baseTransport()
	if ok && st.authErr != nil {
		// The Authorizer failed: nothing of this attempt is sent.
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, st.authErr
	}
	if !ok || req.Context().Err() != nil {
		// Without a call's budget, or with its context done (the base
		// transport then fails at once), there is nothing to bound.
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
	resp, err := base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		st.noteCut(ctx, req.Context(), reason)
		cancel()
		return nil, err
	}
	resp.Body = st.answerBody(resp.Body, ctx, req.Context(), cancel, reason)
	return resp, nil
}

// CloseIdleConnections closes the base transport's idle connections, as
// http.Client.CloseIdleConnections would without the wrapper.
func (t budgetTransport) CloseIdleConnections() {
	if c, ok := t.baseTransport().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// baseTransport is the transport the attempts go through: the
// http.Client's, or http.DefaultTransport as net/http would use.
func (t budgetTransport) baseTransport() http.RoundTripper {
	if t.base == nil {
		return http.DefaultTransport
	}
	return t.base
}

// budgetBody is an attempt's answer body; closing it ends the attempt's
// time limit.
type budgetBody struct {
	io.ReadCloser
	st          *call
	ctx, parent context.Context
	cancel      context.CancelFunc
	reason      string
}

func (b *budgetBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.st.noteCut(b.ctx, b.parent, b.reason)
	}
	return n, err
}

func (b *budgetBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
