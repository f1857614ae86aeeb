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
	d        *device
	req      *http.Request
	faulty   bool // read once, as the call starts
	isPost   bool
	isLookup bool
	followUp bool // the request follows the edge's 307
}

// rate is the chance of f per opportunity in this call.
func (c *call) rate(f faultClass) float64 {
	if !c.faulty {
		return 0
	}
	return c.d.w.cfg.Faults.rate(f)
}

// chance is class f's chance, drawn from the network's stream.
func (c *call) chance(f faultClass) fault.Predicate { return fault.Chance(c.rate(f), c.d.w.netRNG) }

var (
	isPost   = fault.Method(http.MethodPost)
	isLookup = fault.And(fault.Method(http.MethodGet), fault.Query("idempotency_key"))
)

// counted returns a draw that counts class f, then makes e.
func (c *call) counted(f faultClass, e func() fault.Effect) func(fault.Op) fault.Effect {
	return func(fault.Op) fault.Effect {
		c.d.w.stats.fault(f.Name())
		return e()
	}
}

// answerOf is the intermediary's answer a as an effect.
func answerOf(a answer) fault.Effect {
	return fault.Effect{Kind: fault.Status, Status: a.status, Header: a.header, Body: a.body}
}

// offline takes the device off the network now and then.
func (c *call) offline() fault.Injector {
	r := c.d.w.netRNG
	return &fault.Rule{When: c.chance(faultOffline), Draw: c.counted(faultOffline, func() fault.Effect {
		away := r.between(time.Minute, 10*time.Minute)
		if r.chance(0.1) {
			// A flight, a holiday in airplane mode: the tap is retried a
			// day or two later.
			away = r.between(20*time.Hour, 50*time.Hour)
		}
		return fault.Effect{Kind: goOffline, Delay: away}
	})}
}

// edge is what the boxes in front of the server do before they pass the
// request on: reset it, or answer it themselves.
func (c *call) edge() fault.Injector {
	d, w, r, req := c.d, c.d.w, c.d.w.netRNG, c.req
	traced := func(format string, a answer) fault.Effect {
		w.tracef(format, d.id, a.status, req.Method, req.URL)
		return answerOf(a)
	}
	notFollowUp := func(fault.Op) bool { return !c.followUp }
	cachedHere := func(fault.Op) bool { return w.cdn[req.URL.String()] != nil }
	return fault.First(
		&fault.Rule{When: c.chance(faultReset), Draw: c.counted(faultReset, func() fault.Effect {
			w.tracef("d%d: connection reset before sending %s %s", d.id, req.Method, req.URL)
			return fault.Effect{Kind: fault.Reset}
		})},
		&fault.Rule{When: c.chance(faultProxyStatus), Draw: c.counted(faultProxyStatus, func() fault.Effect {
			return traced("d%d: the intermediary answers %d to %s %s", proxyAnswer(w, pick(r, 408, 429, 500, 502, 503, 504)))
		})},
		&fault.Rule{When: c.chance(faultProxyOther5xx), Draw: c.counted(faultProxyOther5xx, func() fault.Effect {
			return traced("d%d: the intermediary answers %d to %s %s", proxyAnswer(w, pick(r, 501, 507, 520, 521, 522, 523, 524)))
		})},
		// To the same URL: the server fingerprints the path and the query,
		// so a redirect elsewhere would make the followed POST another
		// request to it. The follow-up is not redirected again.
		&fault.Rule{When: fault.And(isPost, notFollowUp, c.chance(faultRedirect307)), Draw: c.counted(faultRedirect307, func() fault.Effect {
			d.redirected = true
			return answerOf(answer{status: http.StatusTemporaryRedirect, header: http.Header{"Location": {req.URL.RequestURI()}}})
		})},
		&fault.Rule{When: fault.And(isPost, c.chance(faultRedirectLogin)), Draw: c.counted(faultRedirectLogin, func() fault.Effect {
			return answerOf(answer{status: http.StatusFound, header: http.Header{"Location": {"/login"}}})
		})},
		// A gateway refuses the POST without passing it on (its session
		// expired, a WAF rule, proxy authentication), or a captive portal
		// answers it with its login page. An earlier attempt may have
		// reached the server and been charged.
		&fault.Rule{When: fault.And(isPost, c.chance(faultRefusePost)), Draw: c.counted(faultRefusePost, func() fault.Effect {
			return traced("d%d: a gateway answers %d to %s %s", pick(r,
				answer{status: http.StatusUnauthorized, header: http.Header{"Content-Type": {"application/json"}}, body: []byte(`{"message":"Unauthorized"}`)},
				answer{status: http.StatusForbidden, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Request blocked</html>")},
				answer{status: http.StatusProxyAuthRequired, header: http.Header{"Content-Type": {"text/html"}, "Proxy-Authenticate": {"Basic"}}, body: []byte("<html>Proxy login</html>")},
				answer{status: http.StatusOK, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Sign in to the Wi-Fi</html>")},
			))
		})},
		// An ingress or CDN in front of the lookup path answers its own
		// 404 page.
		&fault.Rule{When: fault.And(isLookup, c.chance(faultLookup404)), Draw: c.counted(faultLookup404, func() fault.Effect {
			return answerOf(pick(r,
				answer{status: http.StatusNotFound, header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html><h1>404 Not Found</h1>nginx</html>")},
				answer{status: http.StatusNotFound, header: http.Header{"Content-Type": {"application/problem+json"}}, body: []byte(`{"type":"about:blank","title":"Not Found","status":404}`)},
			))
		})},
		// A CDN serving a single-page app answers every unknown path
		// with its index.html.
		&fault.Rule{When: fault.And(isLookup, c.chance(faultLookupFallback)), Draw: c.counted(faultLookupFallback, func() fault.Effect {
			return answerOf(answer{status: http.StatusOK, header: http.Header{"Content-Type": {"text/html"}},
				body: []byte(`<!doctype html><html><div id="root"></div></html>`)})
		})},
		&fault.Rule{When: fault.And(isLookup, c.chance(faultLookupGateway)), Draw: c.counted(faultLookupGateway, func() fault.Effect {
			return answerOf(answer{status: pick(r, http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired),
				header: http.Header{"Content-Type": {"text/html"}}, body: []byte("<html>Access denied</html>")})
		})},
		// The CDN answers from its cache: the server's answer to an
		// earlier lookup of the key, nonce echo and all.
		&fault.Rule{When: fault.And(isLookup, cachedHere, c.chance(faultLookupCache)), Draw: c.counted(faultLookupCache, func() fault.Effect {
			kept := w.cdn[req.URL.String()]
			a := kept.ans
			a.header = a.header.Clone()
			a.header.Set("Age", strconv.Itoa(int(w.clk.now.Sub(kept.at)/time.Second)))
			w.tracef("d%d: the CDN answers %s from its cache (%d, age %s)", d.id, req.URL, a.status, w.clk.now.Sub(kept.at))
			return answerOf(a)
		})},
		// A debugging gateway reflects the request into its own answer:
		// its header fields, and its query parameters as header fields.
		// So its 404 carries the key, as the server's echo would.
		&fault.Rule{When: fault.And(isLookup, c.chance(faultLookupReflect)), Draw: c.counted(faultLookupReflect, func() fault.Effect {
			a := answer{status: http.StatusNotFound, header: req.Header.Clone(), body: []byte("<html>No route</html>")}
			a.header.Set("Content-Type", "text/html")
			a.header.Set("Idempotency-Key", req.URL.Query().Get("idempotency_key"))
			return answerOf(a)
		})},
	)
}

// transit is what the network does to a request on its way: lose it, or
// hold it.
func (c *call) transit() fault.Injector {
	d, w, r := c.d, c.d.w, c.d.w.netRNG
	stuck := func(fault.Op) bool { return c.faulty && w.clk.now.Before(d.stuckUntil) }
	return fault.First(
		&fault.Rule{When: c.chance(faultLoseRequest), Draw: c.counted(faultLoseRequest, func() fault.Effect {
			return fault.Effect{Kind: fault.LoseRequest}
		})},
		// The POST goes out on the stuck connection too.
		&fault.Rule{When: fault.And(isPost, stuck), Draw: c.counted(faultHold, func() fault.Effect {
			return fault.Effect{Kind: fault.Hold, Delay: r.between(time.Second, w.cfg.MaxTransit)}
		})},
		// The request is held in transit. A POST sticks the device's
		// connection for a while, so that its retries are held too (a
		// phone whose mobile data stalls). Other requests, such as the
		// reconcile lookup, may take another path.
		&fault.Rule{When: c.chance(faultHold), Draw: c.counted(faultHold, func() fault.Effect {
			e := fault.Effect{Kind: fault.Hold, Delay: r.between(time.Second, w.cfg.MaxTransit)}
			if c.isPost {
				d.stuckUntil = w.clk.now.Add(r.between(10*time.Second, w.cfg.MaxTransit))
			}
			return e
		})},
	)
}

// answer is what the network does to the answer: lose it, cut its body,
// or have the intermediary replace it after passing the request on.
func (c *call) answer() fault.Injector {
	w, r := c.d.w, c.d.w.netRNG
	replaced := func(f faultClass, statuses ...int) *fault.Rule {
		// The intermediary passed the request on, and answers on its own
		// anyway: the work may be done.
		return &fault.Rule{When: c.chance(f), Draw: func(fault.Op) fault.Effect {
			w.stats.fault(f.Name() + " after forwarding")
			status := pick(r, statuses...)
			return fault.Effect{Kind: fault.Status, Status: status, RetryAfter: retryAfter(w)}
		}}
	}
	return fault.First(
		&fault.Rule{When: c.chance(faultLoseAnswer), Draw: c.counted(faultLoseAnswer, func() fault.Effect {
			return fault.Effect{Kind: fault.LoseAnswer}
		})},
		&fault.Rule{When: c.chance(faultCutBody), Draw: c.counted(faultCutBody, func() fault.Effect {
			return fault.Effect{Kind: fault.CutAnswer, Bytes: -1}
		})},
		replaced(faultProxyStatus, 408, 429, 500, 502, 503, 504),
		replaced(faultProxyOther5xx, 501, 507, 520, 521, 522, 523, 524),
	)
}

// slow delays the answer on its way back, at times past the device's
// timeout.
func (c *call) slow() fault.Injector {
	d, r := c.d, c.d.w.netRNG
	return &fault.Rule{When: c.chance(faultSlowAnswer), Draw: c.counted(faultSlowAnswer, func() fault.Effect {
		return fault.Effect{Kind: fault.SlowAnswer, Delay: r.between(time.Second, 3*d.attemptTimeout/2)}
	})}
}

// duplicate has the intermediary send the POST again on its own. The
// copy leaves at once, racing the first, within a second of it, or up
// to the longest transit later.
func (c *call) duplicate(transit time.Duration) fault.Injector {
	w, r := c.d.w, c.d.w.netRNG
	return &fault.Rule{When: fault.And(isPost, c.chance(faultDuplicate)), Draw: c.counted(faultDuplicate, func() fault.Effect {
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

// crashInTransit kills half of the devices whose request is in transit.
// They come back before the request arrives, as a killed app restarted
// at once does.
func (c *call) crashInTransit(transit time.Duration) fault.Injector {
	w := c.d.w
	inTransit := func(fault.Op) bool {
		return transit > 0 && w.faulty && w.cfg.Faults[faultHoldAcrossCrash]
	}
	return &fault.Rule{When: fault.And(inTransit, fault.Chance(0.5, w.netRNG)), Draw: c.counted(faultCrash, func() fault.Effect {
		return fault.Effect{Kind: crashInTransit}
	})}
}

// serverFaultRules are what the server does to a POST: its worker dies or
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
