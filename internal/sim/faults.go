package sim

import (
	"fmt"
	"strings"
)

// faultClass is a class of fault the world can inject.
type faultClass int

// The fault classes. Each has a name (used in IDEM_SIM_FAULTS and in the
// run's figures), a rate (the chance per opportunity while the world is
// faulty) and whether it is on by default.
const (
	faultLoseRequest faultClass = iota
	faultHold
	faultLoseAnswer
	faultCutBody
	faultReset
	faultSlowAnswer
	faultProxyStatus
	faultProxyOther5xx
	faultRedirect307
	faultRedirectLogin
	faultDuplicate
	faultHoldAcrossCrash
	faultRefusePost
	faultLookup404
	faultLookupFallback
	faultLookupGateway
	faultLookupReflect
	faultLookupCache

	faultCrash
	faultPowerCut
	faultDiskFull
	faultClockForward
	faultClockBack
	faultKeySpelling
	faultOffline
	faultTwoClients
	faultSaveAfterAnswer
	faultNotSentWrite
	faultWriteLands
	faultOuterRetry
	faultClockDays
	faultAuthorizer
	faultHandOut
	faultSettleAllRace

	faultServerCrash
	faultCrashAfterInsert
	faultCrashAfterCharge
	faultError500
	faultSlowWork
	faultStorePause
	faultStoreErrorInsert
	faultStoreErrorComplete
	faultSweep
	faultStored5xx
	faultSeeOther

	numFaults
)

type faultInfo struct {
	name string
	rate float64
	on   bool
	// off says why a class is off by default: the fix it waits for, or
	// the defect it finds.
	off string
}

var faultTable = [numFaults]faultInfo{
	faultLoseRequest:     {"net.lose-request", 0.04, true, ""},
	faultHold:            {"net.hold", 0.06, true, ""},
	faultLoseAnswer:      {"net.lose-answer", 0.05, true, ""},
	faultCutBody:         {"net.cut-body", 0.03, true, ""},
	faultReset:           {"net.reset", 0.03, true, ""},
	faultSlowAnswer:      {"net.slow-answer", 0.04, true, ""},
	faultProxyStatus:     {"proxy.status", 0.06, true, ""},
	faultProxyOther5xx:   {"proxy.other-5xx", 0.04, true, ""},
	faultRedirect307:     {"proxy.redirect-307", 0.02, true, ""},
	faultRedirectLogin:   {"proxy.redirect-login", 0.02, true, ""},
	faultDuplicate:       {"proxy.duplicate-post", 0.03, true, ""},
	faultHoldAcrossCrash: {"net.hold-across-crash", 0.5, true, ""},
	faultRefusePost:      {"proxy.refuse-post", 0.03, true, ""},
	faultLookup404:       {"lookup.proxy-404", 0.08, true, ""},
	faultLookupFallback:  {"lookup.fallback-200", 0.08, true, ""},
	faultLookupGateway:   {"lookup.gateway-4xx", 0.08, true, ""},
	faultLookupReflect:   {"lookup.reflecting-gateway", 0.08, true, ""},
	// Per lookup: a CDN whose rule caches everything on the path answers
	// from its cache, with the Age it kept the answer, whatever the
	// answer's no-store said. Its cache key is the URL alone.
	faultLookupCache: {"lookup.caching-cdn", 0.3, true, ""},

	faultCrash:        {"device.crash", 0.02, true, ""},
	faultPowerCut:     {"device.power-cut", 0.01, true, ""},
	faultDiskFull:     {"device.disk-full", 0.01, true, ""},
	faultClockForward: {"device.clock-forward", 0.01, true, ""},
	faultClockBack:    {"device.clock-back", 0.01, true, ""},
	faultKeySpelling:  {"device.key-spelling", 0.3, true, ""},
	faultOffline:      {"device.offline", 0.01, true, ""},
	// Per start of an app: a second Client on the same store.
	faultTwoClients: {"device.two-clients", 0.4, true, ""},
	// Per save of an outcome: the disk is full right after the answer.
	faultSaveAfterAnswer: {"device.save-after-answer", 0.05, true, ""},
	// Per write of "not sent": the disk is full right then, so the app
	// must not be told "not sent".
	faultNotSentWrite: {"device.not-sent-write-fails", 0.3, true, ""},
	// Per write: the record reaches the disk, and the write reports an
	// error all the same (its fsync failed): the writer cannot tell
	// whether it landed. An arming write that fails may have armed.
	faultWriteLands: {"device.write-lands-but-fails", 0.02, true, ""},
	// Per tap: the app pays through Client.RoundTripper under an API
	// client that resends the same *http.Request after an error.
	faultOuterRetry: {"app.outer-retry", 0.1, true, ""},
	// Per user action: the device clock goes days behind or ahead, and is
	// corrected later; the app prunes its store at every start.
	faultClockDays: {"device.clock-days", 0.005, true, ""},
	// Per attempt: the app's Authorizer fails (a token refresh that
	// cannot reach its server) before the attempt is sent.
	faultAuthorizer: {"app.authorizer-fails", 0.05, true, ""},
	// Per tap: the app asks for the intent's exact request
	// (Client.HTTPRequest) and sends it through an http.Client of its
	// own, which may hold it in transit like any other; the app tells
	// the Client when its send ended, unless it dies first.
	faultHandOut: {"app.hand-out", 0.1, true, ""},
	// Per start: the app settles with SettleAll (one intent at a time),
	// and the user acts between two of its settles, after SettleAll
	// listed its intents: often on the action SettleAll sends next, at
	// times while the radio is down.
	faultSettleAllRace: {"app.settle-all-races-tap", 0.3, true, ""},

	faultServerCrash:        {"server.crash", 0.003, true, ""},
	faultCrashAfterInsert:   {"server.crash-after-insert", 0.03, true, ""},
	faultCrashAfterCharge:   {"server.crash-after-charge", 0.03, true, ""},
	faultError500:           {"server.error-500", 0.03, true, ""},
	faultSlowWork:           {"server.slow", 0.04, true, ""},
	faultStorePause:         {"server.store-pause", 0.1, true, ""},
	faultStoreErrorInsert:   {"server.store-error-insert", 0.02, true, ""},
	faultStoreErrorComplete: {"server.store-error-complete", 0.02, true, ""},
	faultSweep:              {"server.sweep", 1, true, ""},
	faultStored5xx:          {"server.stored-5xx", 0.5, true, ""},
	// Per charge: the server answers the created payment with 303 See
	// Other to it, and replays that answer to every retry.
	faultSeeOther: {"server.see-other", 0.2, true, ""},
}

// Name returns the fault's name.
func (f faultClass) Name() string { return faultTable[f].name }

// faultSet says which fault classes are on.
type faultSet [numFaults]bool

// defaultFaults is the set of classes on by default.
func defaultFaults() faultSet {
	var fs faultSet
	for i, fi := range faultTable {
		fs[i] = fi.on
	}
	return fs
}

// rate is the chance of f per opportunity, or 0 when f is off.
func (fs *faultSet) rate(f faultClass) float64 {
	if !fs[f] {
		return 0
	}
	return faultTable[f].rate
}

// parseFaults applies a spec to fs: a comma-separated list of class names,
// each turned on, or off when prefixed with '-'; "all" and "-all" name
// every class.
func parseFaults(fs faultSet, spec string) (faultSet, error) {
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		on := true
		if strings.HasPrefix(item, "-") {
			on, item = false, item[1:]
		} else {
			item = strings.TrimPrefix(item, "+")
		}
		if item == "all" {
			for i := range fs {
				fs[i] = on
			}
			continue
		}
		found := false
		for i, fi := range faultTable {
			if fi.name == item {
				fs[i], found = on, true
			}
		}
		if !found {
			return fs, fmt.Errorf("sim: unknown fault class %q (known: %s)", item, strings.Join(faultNames(), ", "))
		}
	}
	return fs, nil
}

func faultNames() []string {
	out := make([]string, numFaults)
	for i, fi := range faultTable {
		out[i] = fi.name
	}
	return out
}

// String lists the classes that are on.
func (fs faultSet) String() string {
	var on []string
	for i, fi := range faultTable {
		if fs[i] {
			on = append(on, fi.name)
		}
	}
	return strings.Join(on, ",")
}
