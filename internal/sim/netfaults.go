package sim

import (
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/fakeserver/fault"
)

// The world's network faults are rules of package fault. Their chances
// draw from the world's streams, in the order the rules are asked. So a
// seed replays them.

// The world's own effects, beside package fault's.
const (
	// goOffline takes the device off the network for Effect.Delay.
	goOffline fault.Kind = "sim.offline"
	// crashInTransit kills the device while its request is in transit.
	crashInTransit fault.Kind = "sim.crash-in-transit"
	// storeErrorInsert and storeErrorComplete fail that store step.
	storeErrorInsert   fault.Kind = "sim.store-error-insert"
	storeErrorComplete fault.Kind = "sim.store-error-complete"
	// storePause holds a store step for Effect.Delay.
	storePause fault.Kind = "sim.store-pause"
	// seeOther answers a new charge 303 See Other to the payment.
	seeOther fault.Kind = "sim.see-other"
)

// call is one request of a device, as the network's rules see it.
type call struct {
	req      *http.Request
	faulty   bool // read once, as the call starts
	isPost   bool
	isLookup bool
	followUp bool          // the request follows the edge's 307
	transit  time.Duration // how long the request is held on its way
}

// netRules are a device's network faults, made once. They read the
// device's current call as they are asked. A call asks them all before
// it waits for its answer.
type netRules struct {
	d   *device
	cur *call

	offline, edge, transit, answer, slow, duplicate, crash fault.Injector
}

// newNetRules makes d's rules.
func newNetRules(d *device) *netRules {
	n := &netRules{d: d}
	n.offline, n.edge, n.transit, n.answer = n.offlineRule(), n.edgeRules(), n.transitRules(), n.answerRules()
	n.slow, n.duplicate, n.crash = n.slowRule(), n.duplicateRule(), n.crashRule()
	return n
}

// chance is class f's chance while the call is faulty. It draws from the
// network's stream.
func (n *netRules) chance(f faultClass) fault.Predicate {
	return fault.And(func(fault.Op) bool { return n.cur.faulty }, fault.Chance(n.d.w.cfg.Faults.rate(f), n.d.w.netRNG))
}

var (
	isPost   = fault.Method(http.MethodPost)
	isLookup = fault.And(fault.Method(http.MethodGet), fault.Query("idempotency_key"))
)

// counted returns a draw that counts class f, then makes e.
func (n *netRules) counted(f faultClass, e func() fault.Effect) func(fault.Op) fault.Effect {
	return func(fault.Op) fault.Effect {
		n.d.w.stats.fault(f.Name())
		return e()
	}
}

// answerOf is the intermediary's answer a as an effect.
func answerOf(a answer) fault.Effect {
	return fault.Effect{Kind: fault.Status, Status: a.status, Header: a.header, Body: a.body}
}

// offlineRule takes the device off the network now and then.
func (n *netRules) offlineRule() fault.Injector {
	r := n.d.w.netRNG
	return &fault.Rule{When: n.chance(faultOffline), Draw: n.counted(faultOffline, func() fault.Effect {
		away := r.between(time.Minute, 10*time.Minute)
		if r.chance(0.1) {
			// A flight, a holiday in airplane mode: the tap is retried a
			// day or two later.
			away = r.between(20*time.Hour, 50*time.Hour)
		}
		return fault.Effect{Kind: goOffline, Delay: away}
	})}
}

// edgeRules are what the boxes in front of the server do before they pass
// the request on. They reset it, or answer it themselves.
func (n *netRules) edgeRules() fault.Injector {
	d, w, r := n.d, n.d.w, n.d.w.netRNG
	traced := func(format string, a answer) fault.Effect {
		w.tracef(format, d.id, a.status, n.cur.req.Method, n.cur.req.URL)
		return answerOf(a)
	}
	notFollowUp := func(fault.Op) bool { return !n.cur.followUp }
	cachedHere := func(fault.Op) bool { return w.cdn[n.cur.req.URL.String()] != nil }
	return fault.First(
		&fault.Rule{When: n.chance(faultReset), Draw: n.counted(faultReset, func() fault.Effect {
			w.tracef("d%d: connection reset before sending %s %s", d.id, n.cur.req.Method, n.cur.req.URL)
			return fault.Effect{Kind: fault.Reset}
		})},
		&fault.Rule{When: n.chance(faultProxyStatus), Draw: n.counted(faultProxyStatus, func() fault.Effect {
			return traced("d%d: the intermediary answers %d to %s %s", proxyAnswer(w, pick(r, 408, 429, 500, 502, 503, 504)))
		})},
		&fault.Rule{When: n.chance(faultProxyOther5xx), Draw: n.counted(faultProxyOther5xx, func() fault.Effect {
			return traced("d%d: the intermediary answers %d to %s %s", proxyAnswer(w, pick(r, 501, 507, 520, 521, 522, 523, 524)))
		})},
		// To the same URL: the server fingerprints the path and the query,
		// so a redirect elsewhere would make the followed POST another
		// request to it. The follow-up is not redirected again.
		&fault.Rule{When: fault.And(isPost, notFollowUp, n.chance(faultRedirect307)), Draw: n.counted(faultRedirect307, func() fault.Effect {
			d.redirected = true
			return answerOf(answer{status: http.StatusTemporaryRedirect, header: http.Header{"Location": {n.cur.req.URL.RequestURI()}}})
		})},
		&fault.Rule{When: fault.And(isPost, n.chance(faultRedirectLogin)), Draw: n.counted(faultRedirectLogin, func() fault.Effect {
			return answerOf(answer{status: http.StatusFound, header: http.Header{"Location": {"/login"}}})
		})},
		// A gateway refuses the POST without passing it on (its session
		// expired, a WAF rule, proxy authentication), or a captive portal
		// answers it with its login page. An earlier attempt may have
		// reached the server and been charged.
		&fault.Rule{When: fault.And(isPost, n.chance(faultRefusePost)), Draw: n.counted(faultRefusePost, func() fault.Effect {
			return traced("d%d: a gateway answers %d to %s %s", pick(r,
				answer{status: http.StatusUnauthorized, header: http.Header{"Content-Type": {"application/json"}}, body: []byte(`{"message":"Unauthorized"}`)},
				answer{status: http.StatusForbidden, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Request blocked</html>")},
				answer{status: http.StatusProxyAuthRequired, header: http.Header{"Content-Type": {"text/html"}, "Proxy-Authenticate": {"Basic"}}, body: []byte("<html>Proxy login</html>")},
				answer{status: http.StatusOK, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Sign in to the Wi-Fi</html>")},
			))
		})},
		// An ingress or CDN in front of the lookup path answers its own
		// 404 page.
		&fault.Rule{When: fault.And(isLookup, n.chance(faultLookup404)), Draw: n.counted(faultLookup404, func() fault.Effect {
			return answerOf(pick(r,
				answer{status: http.StatusNotFound, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html><h1>404 Not Found</h1>nginx</html>")},
				answer{status: http.StatusNotFound, header: http.Header{"Content-Type": {"application/problem+json"}}, body: []byte(`{"type":"about:blank","title":"Not Found","status":404}`)},
			))
		})},
		// A CDN serving a single-page app answers every unknown path
		// with its index.html.
		&fault.Rule{When: fault.And(isLookup, n.chance(faultLookupFallback)), Draw: n.counted(faultLookupFallback, func() fault.Effect {
			return answerOf(answer{status: http.StatusOK, header: http.Header{"Content-Type": {"text/html"}},
				body: []byte(`<!doctype html><html><div id="root"></div></html>`)})
		})},
		&fault.Rule{When: fault.And(isLookup, n.chance(faultLookupGateway)), Draw: n.counted(faultLookupGateway, func() fault.Effect {
			return answerOf(answer{status: pick(r, http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired),
				header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Access denied</html>")})
		})},
		// The CDN answers from its cache: the server's answer to an
		// earlier lookup of the key, nonce echo and all.
		&fault.Rule{When: fault.And(isLookup, cachedHere, n.chance(faultLookupCache)), Draw: n.counted(faultLookupCache, func() fault.Effect {
			kept := w.cdn[n.cur.req.URL.String()]
			a := kept.ans
			a.header = a.header.Clone()
			a.header.Set("Age", strconv.Itoa(int(w.parts.now().Sub(kept.at)/time.Second)))
			w.tracef("d%d: the CDN answers %s from its cache (%d, age %s)", d.id, n.cur.req.URL, a.status, w.parts.now().Sub(kept.at))
			return answerOf(a)
		})},
		// A debugging gateway reflects the request into its own answer:
		// its header fields, and its query parameters as header fields.
		// So its 404 carries the key, as the server's echo would.
		&fault.Rule{When: fault.And(isLookup, n.chance(faultLookupReflect)), Draw: n.counted(faultLookupReflect, func() fault.Effect {
			a := answer{status: http.StatusNotFound, header: n.cur.req.Header.Clone(), body: []byte("<html>No route</html>")}
			a.header.Set("Content-Type", "text/html")
			a.header.Set("Idempotency-Key", n.cur.req.URL.Query().Get("idempotency_key"))
			return answerOf(a)
		})},
	)
}

// transitRules are what the network does to a request on its way. It
// loses the request, or holds it.
func (n *netRules) transitRules() fault.Injector {
	d, w, r := n.d, n.d.w, n.d.w.netRNG
	stuck := func(fault.Op) bool { return n.cur.faulty && w.parts.now().Before(d.stuckUntil) }
	return fault.First(
		&fault.Rule{When: n.chance(faultLoseRequest), Draw: n.counted(faultLoseRequest, func() fault.Effect {
			return fault.Effect{Kind: fault.LoseRequest}
		})},
		// The POST goes out on the stuck connection too.
		&fault.Rule{When: fault.And(isPost, stuck), Draw: n.counted(faultHold, func() fault.Effect {
			return fault.Effect{Kind: fault.Hold, Delay: r.between(time.Second, w.cfg.MaxTransit)}
		})},
		// The request is held in transit. A POST sticks the device's
		// connection for a while, so that its retries are held too (a
		// phone whose mobile data stalls). Other requests, such as the
		// reconcile lookup, may take another path.
		&fault.Rule{When: n.chance(faultHold), Draw: n.counted(faultHold, func() fault.Effect {
			e := fault.Effect{Kind: fault.Hold, Delay: r.between(time.Second, w.cfg.MaxTransit)}
			if n.cur.isPost {
				d.stuckUntil = w.parts.now().Add(r.between(10*time.Second, w.cfg.MaxTransit))
			}
			return e
		})},
	)
}

// answerRules are what the network does to the answer. It loses the
// answer or cuts its body. Or the intermediary replaces it after passing
// the request on.
func (n *netRules) answerRules() fault.Injector {
	w, r := n.d.w, n.d.w.netRNG
	replaced := func(f faultClass, statuses ...int) *fault.Rule {
		// The intermediary passed the request on, and answers on its own
		// anyway: the work may be done.
		return &fault.Rule{When: n.chance(f), Draw: func(fault.Op) fault.Effect {
			w.stats.fault(f.Name() + " after forwarding")
			status := pick(r, statuses...)
			return fault.Effect{Kind: fault.Status, Status: status, RetryAfter: retryAfter(w)}
		}}
	}
	return fault.First(
		&fault.Rule{When: n.chance(faultLoseAnswer), Draw: n.counted(faultLoseAnswer, func() fault.Effect {
			return fault.Effect{Kind: fault.LoseAnswer}
		})},
		&fault.Rule{When: n.chance(faultCutBody), Draw: n.counted(faultCutBody, func() fault.Effect {
			return fault.Effect{Kind: fault.CutAnswer, Bytes: -1}
		})},
		replaced(faultProxyStatus, 408, 429, 500, 502, 503, 504),
		replaced(faultProxyOther5xx, 501, 507, 520, 521, 522, 523, 524),
	)
}

// slowRule delays the answer on its way back, at times past the device's
// timeout.
func (n *netRules) slowRule() fault.Injector {
	d, r := n.d, n.d.w.netRNG
	return &fault.Rule{When: n.chance(faultSlowAnswer), Draw: n.counted(faultSlowAnswer, func() fault.Effect {
		return fault.Effect{Kind: fault.SlowAnswer, Delay: r.between(time.Second, 3*d.attemptTimeout/2)}
	})}
}

// duplicateRule has the intermediary send the POST again on its own. The
// copy leaves at once, racing the first, within a second of it, or up
// to the longest transit later.
func (n *netRules) duplicateRule() fault.Injector {
	w, r := n.d.w, n.d.w.netRNG
	return &fault.Rule{When: fault.And(isPost, n.chance(faultDuplicate)), Draw: n.counted(faultDuplicate, func() fault.Effect {
		transit := n.cur.transit
		var at time.Duration
		switch r.IntN(3) {
		case 0:
			at = transit
		case 1:
			at = transit + r.between(0, time.Second)
		default:
			at = r.between(transit, w.cfg.MaxTransit)
		}
		return fault.Effect{Kind: fault.Duplicate, Delay: at - transit}
	})}
}

// crashRule kills half of the devices whose request is in transit.
// They come back before the request arrives, as a killed app restarted
// at once does.
func (n *netRules) crashRule() fault.Injector {
	w := n.d.w
	inTransit := func(fault.Op) bool {
		return n.cur.transit > 0 && w.faulty && w.cfg.Faults[faultHoldAcrossCrash]
	}
	return &fault.Rule{When: fault.And(inTransit, fault.Chance(0.5, w.netRNG)), Draw: n.counted(faultCrash, func() fault.Effect {
		return fault.Effect{Kind: crashInTransit}
	})}
}

// serverFaultRules are what the server does to a POST. Its worker dies or
// fails, its work is slow, its store fails. They draw from the server's
// stream.
func serverFaultRules(w *world) fault.Injector {
	r := w.serverRNG
	faultyPost := fault.And(func(fault.Op) bool { return w.faulty }, isPost)
	chance := func(f faultClass) fault.Predicate {
		return fault.And(faultyPost, fault.Chance(w.cfg.Faults.rate(f), r))
	}
	return fault.All(
		fault.First(
			&fault.Rule{When: chance(faultCrashAfterInsert), Effect: fault.Effect{Kind: fault.CrashAfterInsert}},
			&fault.Rule{When: chance(faultCrashAfterCharge), Effect: fault.Effect{Kind: fault.CrashAfterProvider}},
			&fault.Rule{When: chance(faultError500), Effect: fault.Effect{Kind: fault.Error}},
		),
		&fault.Rule{When: chance(faultSlowWork), Draw: func(fault.Op) fault.Effect {
			w.stats.fault(faultSlowWork.Name())
			return fault.Effect{Kind: fault.Delay, Delay: r.between(time.Second, 2*w.cfg.Lease)}
		}},
		fault.First(
			&fault.Rule{When: chance(faultStoreErrorInsert), Effect: fault.Effect{Kind: storeErrorInsert}},
			&fault.Rule{When: chance(faultStoreErrorComplete), Effect: fault.Effect{Kind: storeErrorComplete}},
		),
	)
}

// storePauses pause a store step now and then, so that requests
// interleave. They draw from the server's stream, calm or not.
func storePauses(w *world) fault.Injector {
	r := w.serverRNG
	return &fault.Rule{When: fault.Chance(w.cfg.Faults.rate(faultStorePause), r), Draw: func(fault.Op) fault.Effect {
		w.stats.fault(faultStorePause.Name())
		return fault.Effect{Kind: storePause, Delay: r.between(0, 2*time.Second)}
	}}
}

// seeOtherRule has the server answer a new charge with 303 See Other.
func seeOtherRule(w *world) fault.Injector {
	faulty := func(fault.Op) bool { return w.faulty }
	return &fault.Rule{When: fault.And(faulty, fault.Chance(w.cfg.Faults.rate(faultSeeOther), w.serverRNG)),
		Draw: func(fault.Op) fault.Effect {
			w.stats.fault(faultSeeOther.Name())
			return fault.Effect{Kind: seeOther}
		}}
}

// serverFaultsOf turns the server's effects into what its handler reads.
func serverFaultsOf(es fault.Effects) serverFaults {
	var f serverFaults
	f.crashAfterInsert = es.Has(fault.CrashAfterInsert)
	f.crashAfterProvider = es.Has(fault.CrashAfterProvider)
	f.errorBeforeCharge = es.Has(fault.Error)
	if e, ok := es.Get(fault.Delay); ok {
		f.slow = e.Delay
	}
	switch {
	case es.Has(storeErrorInsert):
		f.storeError = "insert"
	case es.Has(storeErrorComplete):
		f.storeError = "complete"
	}
	return f
}
