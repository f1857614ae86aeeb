package idempotency_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the middleware's own tests to kill the mutants of
// the rules the simulated world cannot reach.
func TestMutants(t *testing.T) {
	mutant.Test(t, []mutant.Mutant{
		{
			// idem never sends two bodies under one key, so the simulated
			// world cannot reach the fingerprint's rules on member names.
			Name: "fingerprint-ignores-member-case", File: "idempotency/fingerprint.go",
			Note:    "member names are compared as spelled, not folded as encoding/json folds them",
			Anchor:  "c.fold = appendFoldedName(c.fold, c.nameOf(m))",
			Replace: "c.fold = append(c.fold, c.nameOf(m)...)",
			Pkg:     "./idempotency", Run: "^TestFingerprintNeverSharedByBodiesReadDifferently$",
		},
		{
			Name: "memory-lease-on-callers-clock", File: "idempotency/memory.go",
			Note:    "the memory store judges a takeover on its caller's clock, not its own",
			Anchor:  "lease := until.Sub(now)\n\tnow = s.now(now)\n",
			Replace: "lease := until.Sub(now)\n",
			Pkg:     "./idempotency", Run: "^TestMemoryStoreConformance$",
		},
		{
			Name: "memory-expires-under-live-lease", File: "idempotency/store.go",
			Note:    "a record past its retention counts as absent under its worker's live lease",
			Anchor:  "return !r.liveUntil().After(now) }",
			Replace: "return !r.ExpiresAt.After(now) }",
			Pkg:     "./idempotency", Run: "^TestMemoryStoreConformance$",
		},
		{
			Name: "give-up-keeps-lease", File: "idempotency/memory.go",
			Note:    "an owner giving its record up leaves its lease running",
			Anchor:  `(to != "" && r.LockedUntil.After(now))`,
			Replace: "r.LockedUntil.After(now)",
			Pkg:     "./idempotency", Run: "^(TestMemoryStoreConformance|TestAServerErrorKeepsTheStableIDForTheRetry)$",
		},
		{
			Name: "fingerprint-ignores-query", File: "idempotency/fingerprint.go",
			Note:    "the query string is not part of the fingerprint",
			Anchor:  "\t\twriteQuery(h, rawQuery)\n",
			Replace: "\n",
			Pkg:     "./idempotency", Run: "^TestTheQueryIsPartOfTheContent$",
		},
		{
			Name: "query-order-matters", File: "idempotency/fingerprint.go",
			Note:    "query parameters are hashed in the order they were sent",
			Anchor:  "slices.SortStableFunc(params, func(a, b queryParam) int { return strings.Compare(a.name, b.name) })",
			Replace: "",
			Pkg:     "./idempotency", Run: "^TestFingerprintTakesTheQueryCanonically$",
		},
		{
			Name: "query-repeated-values-reordered", File: "idempotency/fingerprint.go",
			Note:    "the values of a repeated name may change order, which url.Values.Get reads differently",
			Anchor:  "slices.SortStableFunc(params",
			Replace: "slices.SortFunc(params",
			Pkg:     "./idempotency", Run: "^TestFingerprintTakesTheQueryCanonically$",
		},
		{
			Name: "old-records-compared-with-new-fingerprint", File: "idempotency/middleware.go",
			Note:    "a record fingerprinted before the query counted is compared with the new algorithm",
			Anchor:  "if existing.FingerprintVersion != 0 && existing.FingerprintVersion != fingerprintV1 {",
			Replace: "if true {",
			Pkg:     "./idempotency", Run: "^TestTheQueryIsPartOfTheContent$",
		},
		{
			Name: "scope-defaults-to-credential", File: "idempotency/middleware.go",
			Note:   "a Config without Principal scopes keys by the raw Authorization value",
			Anchor: `panic("idempotency: Config.Principal is nil: return the account the request acts for, " +`,
			Replace: `cfg.Principal = func(r *http.Request) string { return r.Header.Get("Authorization") }
		_ = ("idempotency: Config.Principal is nil: return the account the request acts for, " +`,
			Pkg: "./idempotency", Run: "^TestNewRequiresThePrincipal$",
		},
		{
			Name: "store-error-text-shown", File: "idempotency/middleware.go",
			Note:    "a 500 answer carries the store's error text",
			Anchor:  `Detail: "the server could not read or write its idempotency records; retry with the same key"}`,
			Replace: `Detail: err.Error()}`,
			Pkg:     "./idempotency", Run: "^TestStoreErrorTextIsLoggedNeverShown$",
		},
		{
			Name: "memory-store-keeps-principal", File: "idempotency/memory.go",
			Note:    "the memory store keys records by the principal itself, not its digest",
			Anchor:  "func digested(id ID) ID { return ID{Principal: PrincipalDigest(id.Principal), Key: id.Key} }",
			Replace: "func digested(id ID) ID { return id }",
			Pkg:     "./idempotency", Run: "^TestMemoryStoreConformance$",
		},
		{
			// The simulated server echoes the key itself, as received
			// (it rewrites keys to compare them raw).
			Name: "no-key-echo", File: "idempotency/middleware.go",
			Note:    "the middleware's answers do not carry the request's key back",
			Anchor:  "	w = echoKey(w, r)\n",
			Replace: "",
			Pkg:     "./idempotency", Run: "^TestEveryAnswerToAKeyedRequestEchoesTheKey$",
		},
		{
			Name: "lease-judged-on-host-clock", File: "idempotency/middleware.go",
			Note:    "the middleware judges a record's lease on its host's clock, not the store's: a host behind keeps a dead worker's key, one ahead tries to take a live one",
			Anchor:  "at := storeNow(existing, now)",
			Replace: "at := now",
			Pkg:     "./idempotency", Run: "^TestLeasesAreJudgedOnTheStoresClock$",
		},
		{
			Name: "retry-after-on-host-clock", File: "idempotency/middleware.go",
			Note:    "a 409's Retry-After counts the lease's time left on the host's clock",
			Anchor:  "m.inProgress(w, r, existing, at)",
			Replace: "m.inProgress(w, r, existing, now)",
			Pkg:     "./idempotency", Run: "^TestLeasesAreJudgedOnTheStoresClock$",
		},
		{
			Name: "memory-read-at-missing", File: "idempotency/memory.go",
			Note:    "the memory store returns a live record without its now, so the middleware judges its lease on the host's clock",
			Anchor:  "cp.ID, cp.ReadAt = rec.ID, now",
			Replace: "cp.ID = rec.ID",
			Pkg:     "./idempotency", Run: "^TestLeasesAreJudgedOnTheStoresClock$",
		},
		{
			Name: "store-timeout-answered-500", File: "idempotency/middleware.go",
			Note:    "a store call past its bound is a 500 without Retry-After, not a 503 to retry",
			Anchor:  "if errors.Is(err, context.DeadlineExceeded) {\n\t\t// The store's bound",
			Replace: "if false {\n\t\t// The store's bound",
			Pkg:     "./idempotency", Run: "^TestAStoreWithoutAnswerIsServiceUnavailable$",
		},
		{
			Name: "full-retry-after-on-host-clock", File: "idempotency/middleware.go",
			Note:    "a full store's Retry-After counts the time to its earliest expiry on the host's clock",
			Anchor:  "now := fe.Now\n",
			Replace: "now := time.Time{}\n",
			Pkg:     "./idempotency", Run: "^TestLeasesAreJudgedOnTheStoresClock$",
		},
	})
}
