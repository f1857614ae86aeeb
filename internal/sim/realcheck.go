package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// check settles what the app left unresolved, once no fault and no held
// request remain, and holds every intent against the server: its lookup,
// a replay of its request, its totals, and the provider's ledger.
func (run *realRun) check() {
	g := run.current()
	ctx := context.Background()
	run.handler.ClearFaults()
	run.wire.rules.Clear()
	run.clock.Advance(realReconcileDelay + time.Minute)
	run.wire.deliver(true) // everything held in transit has arrived by now
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()

	intents := make(map[string]*intentInfo)
	sessions := make(map[[2]int]*session)
	var order []*session
	succeeded := 0
	for _, it := range run.intents {
		id := [2]int{it.i, it.p}
		if sessions[id] == nil {
			sessions[id] = &session{id: cartDesc(it.i, it.p)}
			order = append(order, sessions[id])
		}
		info := &intentInfo{key: it.key, cart: &cart{sess: sessions[id], desc: cartDesc(it.i, it.p)}}
		intents[it.key] = info
		if it.unstored {
			info.reported = persist.StateNotSent // nothing of it left the device
			continue
		}
		in := run.settleAtEnd(g, it)
		if in == nil {
			continue
		}
		info.reported = in.State()
		if run.checkServer(hc, it, in) {
			succeeded++
		}
	}
	stored := make(map[string]persist.State)
	recs, err := g.store.List(ctx, persist.Filter{})
	if err != nil {
		run.bad("listing the device's intents: %v", err)
	}
	for _, rec := range recs {
		stored[rec.Key] = rec.State
	}
	for _, v := range checkLedger(chargesOf(run.handler), intents, order, stored) {
		run.bad("%s", v)
	}
	run.stats.Sessions = len(order)
	run.checkTotals(hc, succeeded)
}

// settleAtEnd loads it and settles it if the app left it unresolved: by
// the lookup, or by resuming it with its key when the lookup cannot tell.
func (run *realRun) settleAtEnd(g *generation, it *rIntent) *idem.Intent {
	ctx := context.Background()
	in, err := g.client.Load(ctx, it.key)
	if err != nil {
		run.bad("intent %s: load: %v", it.key, err)
		return nil
	}
	if in.State().Resolved() {
		return in
	}
	if !it.budgetOut && !it.leftUnknown && !it.redirected {
		run.bad("intent %s is unresolved, but no budget ran out; last error: %v", it.key, it.lastErr)
	}
	if it.final != nil {
		run.bad("intent %s: the app was given a final answer (%d) but the device did not keep it", it.key, it.final.StatusCode)
	}
	resp, err := g.client.Reconcile(ctx, in)
	if errors.Is(err, idem.ErrOutcomeUnknown) {
		// The record is a dead worker's, still in progress: resuming with
		// the same key makes the server recover it.
		run.count("check.resumed-after-unsettled-lookup")
		resp, err = g.client.Do(ctx, in)
		if isAPIError(err) {
			err = nil
		}
	}
	if err != nil {
		run.bad("intent %s: settling at the end: %v", it.key, err)
		return nil
	}
	switch in.State() {
	case persist.StateSucceeded:
		if it.declined {
			run.bad("intent %s: a declined card settled as paid", it.key)
		}
		it.final = resp
	case persist.StateFailed:
		if !it.declined {
			run.bad("intent %s: resumed to a failure", it.key)
		}
		it.final = resp
	case persist.StateVoid:
	default:
		run.bad("intent %s: settled to %s", it.key, in.State())
		return nil
	}
	return in
}

// checkServer holds a settled intent against the server's lookup and, for
// a stored answer, a replay of its request. It reports a success.
func (run *realRun) checkServer(hc *http.Client, it *rIntent, in *idem.Intent) bool {
	state := in.State()
	lookStatus, lookBody, err := fetch(hc, http.MethodGet, run.srv.URL+"/payments?idempotency_key="+it.key, nil, nil)
	if err != nil {
		run.bad("intent %s: lookup: %v", it.key, err)
		return false
	}
	var replay *http.Response
	var replayBody []byte
	if state == persist.StateSucceeded || state == persist.StateFailed {
		// Only a completed record may be resent: any other would do the
		// work.
		h := it.req.Header.Clone()
		h.Set("Idempotency-Key", it.key)
		replay, replayBody, err = fetchResp(hc, it.req.Method, it.req.URL, h, it.req.Body)
		if err != nil {
			run.bad("intent %s: replay: %v", it.key, err)
			return false
		}
	}
	bad := func(format string, args ...any) { run.bad("intent %s: "+format, append([]any{it.key}, args...)...) }
	switch state {
	case persist.StateSucceeded:
		if it.declined {
			bad("a declined card succeeded")
		}
		if lookStatus != http.StatusOK {
			bad("succeeded, but the lookup answers %d", lookStatus)
		}
		if in.Response() == nil {
			bad("succeeded, but the device keeps no answer")
		}
		if it.final == nil {
			return true
		}
		if it.final.StatusCode == http.StatusCreated {
			// The app's answer is the server's stored answer, byte for
			// byte, and the device's.
			if replay.StatusCode != http.StatusCreated || replay.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(replayBody, it.final.Body) {
				bad("the replay is %d (replayed: %q) %s, the app was told 201 %s", replay.StatusCode, replay.Header.Get("Idempotent-Replayed"), replayBody, it.final.Body)
			}
			if in.Response() != nil && !bytes.Equal(in.Response().Body, it.final.Body) {
				bad("the device keeps %s, the app was told %s", in.Response().Body, it.final.Body)
			}
		}
		if a, b := paymentID(lookBody), paymentID(it.final.Body); a == "" || a != b {
			bad("the lookup finds payment %q, the app was told %q", a, b)
		}
		return true
	case persist.StateFailed:
		if !it.declined {
			bad("failed, but its card is good")
		}
		if in.Response() == nil || in.Response().StatusCode != http.StatusPaymentRequired {
			bad("failed without the stored 402")
		}
		if lookStatus != http.StatusNotFound {
			bad("declined, but the lookup answers %d %s", lookStatus, lookBody)
		}
		if replay.StatusCode != http.StatusPaymentRequired || replay.Header.Get("Idempotent-Replayed") != "true" {
			bad("declined, but the replay is %d (replayed: %q)", replay.StatusCode, replay.Header.Get("Idempotent-Replayed"))
		}
		if it.final != nil && !bytes.Equal(replayBody, it.final.Body) {
			bad("the replay's decline %s is not the app's %s", replayBody, it.final.Body)
		}
	case persist.StateVoid:
		if lookStatus != http.StatusNotFound {
			bad("void, but the lookup answers %d %s", lookStatus, lookBody)
		}
	}
	return false
}

// checkTotals holds the server's totals against the intents' outcomes.
func (run *realRun) checkTotals(hc *http.Client, succeeded int) {
	st := run.handler.Stats()
	if st.Payments != succeeded {
		run.bad("the server holds %d payments, the intents %d successes", st.Payments, succeeded)
	}
	if st.ProviderCharges != succeeded {
		run.bad("the provider made %d charges for %d successes: orphans or doubles", st.ProviderCharges, succeeded)
	}
	status, body, err := fetch(hc, http.MethodGet, run.srv.URL+"/payments", nil, nil)
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err == nil && status == http.StatusOK {
		err = json.Unmarshal(body, &list)
	}
	if err != nil || status != http.StatusOK {
		run.bad("listing the payments: %d %v", status, err)
	} else if len(list.Data) != succeeded {
		run.bad("the server lists %d payments, the intents %d successes", len(list.Data), succeeded)
	}
}

// fetch sends one request and reads its answer.
func fetch(hc *http.Client, method, url string, h http.Header, body []byte) (int, []byte, error) {
	resp, b, err := fetchResp(hc, method, url, h, body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

func fetchResp(hc *http.Client, method, url string, h http.Header, body []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if h != nil {
		req.Header = h
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// paymentID returns the id of a payment body, or "".
func paymentID(body []byte) string {
	var p struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	return p.ID
}
