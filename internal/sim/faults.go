package sim

import (
	"fmt"
	"strings"
)

// Fault is a class of fault the world can inject.
type Fault int

// The fault classes. Each has a name (used in IDEM_SIM_FAULTS and in the
// run's figures), a rate (the chance per opportunity while the world is
// faulty) and whether it is on by default.
const (
	FaultLoseRequest Fault = iota
	FaultHold
	FaultLoseAnswer
	FaultCutBody
	FaultReset
	FaultSlowAnswer
	FaultProxyStatus
	FaultProxyOther5xx
	FaultRedirect307
	FaultRedirectLogin
	FaultDuplicate
	FaultHoldAcrossCrash
	FaultRefusePost
	FaultLookup404
	FaultLookupFallback
	FaultLookupGateway
	FaultLookupReflect

	FaultCrash
	FaultPowerCut
	FaultDiskFull
	FaultClockForward
	FaultClockBack
	FaultKeySpelling
	FaultOffline
	FaultTwoClients
	FaultSaveAfterAnswer
	FaultOuterRetry
	FaultClockDays

	FaultServerCrash
	FaultCrashAfterInsert
	FaultCrashAfterCharge
	FaultError500
	FaultSlowWork
	FaultStorePause
	FaultStoreErrorInsert
	FaultStoreErrorComplete
	FaultSweep
	FaultStored5xx

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
	FaultLoseRequest:     {"net.lose-request", 0.04, true, ""},
	FaultHold:            {"net.hold", 0.06, true, ""},
	FaultLoseAnswer:      {"net.lose-answer", 0.05, true, ""},
	FaultCutBody:         {"net.cut-body", 0.03, true, ""},
	FaultReset:           {"net.reset", 0.03, true, ""},
	FaultSlowAnswer:      {"net.slow-answer", 0.04, true, ""},
	FaultProxyStatus:     {"proxy.status", 0.06, true, ""},
	FaultProxyOther5xx:   {"proxy.other-5xx", 0.04, true, ""},
	FaultRedirect307:     {"proxy.redirect-307", 0.02, true, ""},
	FaultRedirectLogin:   {"proxy.redirect-login", 0.02, true, ""},
	FaultDuplicate:       {"proxy.duplicate-post", 0.03, true, ""},
	FaultHoldAcrossCrash: {"net.hold-across-crash", 0.5, true, ""},
	FaultRefusePost:      {"proxy.refuse-post", 0.03, true, ""},
	FaultLookup404:       {"lookup.proxy-404", 0.08, true, ""},
	FaultLookupFallback:  {"lookup.fallback-200", 0.08, true, ""},
	FaultLookupGateway:   {"lookup.gateway-4xx", 0.08, true, ""},
	FaultLookupReflect:   {"lookup.reflecting-gateway", 0.08, true, ""},

	FaultCrash:        {"device.crash", 0.02, true, ""},
	FaultPowerCut:     {"device.power-cut", 0.01, true, ""},
	FaultDiskFull:     {"device.disk-full", 0.01, true, ""},
	FaultClockForward: {"device.clock-forward", 0.01, true, ""},
	FaultClockBack:    {"device.clock-back", 0.01, true, ""},
	FaultKeySpelling:  {"device.key-spelling", 0.3, true, ""},
	FaultOffline:      {"device.offline", 0.01, true, ""},
	// Per start of an app: a second Client on the same store.
	FaultTwoClients: {"device.two-clients", 0.4, true, ""},
	// Per save of an outcome: the disk is full right after the answer.
	FaultSaveAfterAnswer: {"device.save-after-answer", 0.05, true, ""},
	// Per tap: the app pays through Client.RoundTripper under an API
	// client that resends the same *http.Request after an error.
	FaultOuterRetry: {"app.outer-retry", 0.1, true, ""},
	// Per user action: the device clock goes days behind or ahead, and is
	// corrected later; the app prunes its store at every start.
	FaultClockDays: {"device.clock-days", 0.005, true, ""},

	FaultServerCrash:        {"server.crash", 0.003, true, ""},
	FaultCrashAfterInsert:   {"server.crash-after-insert", 0.03, true, ""},
	FaultCrashAfterCharge:   {"server.crash-after-charge", 0.03, true, ""},
	FaultError500:           {"server.error-500", 0.03, true, ""},
	FaultSlowWork:           {"server.slow", 0.04, true, ""},
	FaultStorePause:         {"server.store-pause", 0.1, true, ""},
	FaultStoreErrorInsert:   {"server.store-error-insert", 0.02, true, ""},
	FaultStoreErrorComplete: {"server.store-error-complete", 0.02, true, ""},
	FaultSweep:              {"server.sweep", 1, true, ""},
	FaultStored5xx:          {"server.stored-5xx", 0.5, true, ""},
}

// Name returns the fault's name.
func (f Fault) Name() string { return faultTable[f].name }

// Faults says which fault classes are on.
type Faults [numFaults]bool

// DefaultFaults is the set of classes on by default.
func DefaultFaults() Faults {
	var fs Faults
	for i, fi := range faultTable {
		fs[i] = fi.on
	}
	return fs
}

// rate is the chance of f per opportunity, or 0 when f is off.
func (fs *Faults) rate(f Fault) float64 {
	if !fs[f] {
		return 0
	}
	return faultTable[f].rate
}

// ParseFaults applies a spec to fs: a comma-separated list of class names,
// each turned on, or off when prefixed with '-'; "all" and "-all" name
// every class.
func ParseFaults(fs Faults, spec string) (Faults, error) {
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
func (fs Faults) String() string {
	var on []string
	for i, fi := range faultTable {
		if fs[i] {
			on = append(on, fi.name)
		}
	}
	return strings.Join(on, ",")
}
