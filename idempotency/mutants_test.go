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
			Name: "fingerprint-ignores-member-case", File: "idempotency/internal/canonjson/canonjson.go",
			Note:    "member names are compared as spelled, not folded as encoding/json folds them",
			Anchor:  "c.fold = appendFoldedName(c.fold, c.nameOf(m))",
			Replace: "c.fold = append(c.fold, c.nameOf(m)...)",
			Pkg:     "./idempotency", Run: "^TestFingerprint$/^bodies_read_differently_never_share_it$",
		},
		{
			Name: "incomplete-body-final", File: "idempotency/middleware.go",
			Note:    "a body that ends before its declared length is a final 400: a client stores a charged intent failed, and pays anew",
			Anchor:  "Status: http.StatusRequestTimeout,\n",
			Replace: "Status: http.StatusBadRequest,\n",
			Pkg:     "./idempotency", Run: "^TestContent$/^a_body_that_ends_early",
		},
		{
			Name: "memory-lease-on-callers-clock", File: "idempotency/memory.go",
			Note:    "the memory store judges a takeover on its caller's clock, not its own",
			Anchor:  "lease := until.Sub(now)\n\tnow = s.now(now)\n",
			Replace: "lease := until.Sub(now)\n",
			Pkg:     "./idempotency", Run: "^TestMemoryStore$/^passes_the_store_suite$",
		},
		{
			Name: "memory-expires-under-live-lease", File: "idempotency/store.go",
			Note:    "a record past its retention counts as absent under its worker's live lease",
			Anchor:  "return !r.liveUntil().After(now) }",
			Replace: "return !r.ExpiresAt.After(now) }",
			Pkg:     "./idempotency", Run: "^TestMemoryStore$/^passes_the_store_suite$",
		},
		{
			Name: "give-up-keeps-lease", File: "idempotency/memory.go",
			Note:    "an owner giving its record up leaves its lease running",
			Anchor:  `(to != "" && r.LockedUntil.After(now))`,
			Replace: "r.LockedUntil.After(now)",
			Pkg:     "./idempotency", Run: "^(TestMemoryStore|TestStableID)$/^(passes_the_store_suite|a_server_error_keeps_the_stable_id_for_the_retry)$",
		},
		{
			Name: "fingerprint-ignores-query", File: "idempotency/fingerprint.go",
			Note:    "the query string is not part of the fingerprint",
			Anchor:  "\twriteQuery(h, rawQuery)\n",
			Replace: "\n",
			Pkg:     "./idempotency", Run: "^TestContent$/^the_query_is_part_of_the_content$",
		},
		{
			Name: "query-order-matters", File: "idempotency/fingerprint.go",
			Note:    "query parameters are hashed in the order they were sent",
			Anchor:  "slices.SortStableFunc(params, func(a, b queryParam) int { return strings.Compare(a.name, b.name) })",
			Replace: "slices.SortStableFunc(params, func(a, b queryParam) int { return 0 })",
			Pkg:     "./idempotency", Run: "^TestFingerprint$/^the_query_is_taken_canonically$",
		},
		{
			Name: "query-repeated-values-reordered", File: "idempotency/fingerprint.go",
			Note:    "the values of a repeated name may change order, which url.Values.Get reads differently",
			Anchor:  "slices.SortStableFunc(params",
			Replace: "slices.SortFunc(params",
			Pkg:     "./idempotency", Run: "^TestFingerprint$/^the_query_is_taken_canonically$",
		},
		{
			Name: "other-fingerprint-version-matches", File: "idempotency/middleware.go",
			Note:    "a record whose fingerprint another version of the algorithm made matches a request with the same bytes",
			Anchor:  "return existing.FingerprintVersion == rec.FingerprintVersion && existing.Fingerprint == rec.Fingerprint",
			Replace: "return existing.Fingerprint == rec.Fingerprint",
			Pkg:     "./idempotency", Run: "^TestFingerprint$/^a_record_of_another_version_never_matches$",
		},
		{
			Name: "once-lease-takeover-outside-the-transaction", File: "idempotency/middleware.go",
			Note:    "in the single-transaction mode, an ended lease that RunOnce returned rather than took over is taken over as in the lease mode: the handler runs without its transaction",
			Anchor:  "\t// record ended.\n\tm.inProgress(w, r, busy(rec), now)\n",
			Replace: "\t// record ended.\n\tif !m.takeOver(w, r, rec, existing, parsed, now) {\n\t\tm.inProgress(w, r, busy(rec), now)\n\t}\n",
			Pkg:     "./idempotency", Run: "^TestOneTransaction$/^the_work_never_runs_outside_RunOnce$",
		},
		{
			Name: "scope-defaults-to-credential", File: "idempotency/middleware.go",
			Note:   "a Config without Principal scopes keys by the raw Authorization value",
			Anchor: `panic("idempotency: Config.Principal is nil: return the account the request acts for, " +`,
			Replace: `cfg.Principal = func(r *http.Request) string { return r.Header.Get("Authorization") }
		_ = ("idempotency: Config.Principal is nil: return the account the request acts for, " +`,
			Pkg: "./idempotency", Run: "^TestNew$/^the_principal_is_required$",
		},
		{
			Name: "store-error-text-shown", File: "idempotency/middleware.go",
			Note:    "a 500 answer carries the store's error text",
			Anchor:  `Detail: "the server could not read or write its idempotency records; retry with the same key"}`,
			Replace: `Detail: err.Error()}`,
			Pkg:     "./idempotency", Run: "^TestStoreFailure$/^the_store's_error_text_is_logged_and_never_shown$",
		},
		{
			Name: "memory-store-keeps-principal", File: "idempotency/memory.go",
			Note:    "the memory store keys records by the principal itself, not its digest",
			Anchor:  "func digested(id ID) ID { return ID{Principal: PrincipalDigest(id.Principal), Key: id.Key} }",
			Replace: "func digested(id ID) ID { return id }",
			Pkg:     "./idempotency", Run: "^TestMemoryStore$/^passes_the_store_suite$",
		},
		{
			Name: "uuid-keys-compared-by-case", File: "idempotency/key.go",
			Note:    "in UUID mode a key in upper case and its lower-cased retry are two keys",
			Anchor:  "return CanonicalKey(key, requireUUID), nil",
			Replace: "return key, nil",
			Pkg:     "./idempotency", Run: "^TestKeyedAnswer$/^one_key_is_one_record$",
		},
		{
			Name: "any-key-mode-folds-uuids", File: "idempotency/key.go",
			Note:    "in any-key mode keys are folded to their UUID form, not compared byte for byte",
			Anchor:  "if !requireUUID || len(key) != 36 {",
			Replace: "if len(key) != 36 {",
			Pkg:     "./idempotency", Run: "^TestKeyedAnswer$/^one_key_is_one_record$",
		},
		{
			Name: "fingerprint-of-compressed-bytes", File: "idempotency/middleware.go",
			Note:    "a compressed body is fingerprinted as sent, so a retry compressed again is a 422",
			Anchor:  `if codings := r.Header.Values("Content-Encoding"); len(codings) > 0 {`,
			Replace: `if codings := r.Header.Values("Content-Encoding"); false && len(codings) > 0 {`,
			Pkg:     "./idempotency", Run: "^TestContent$/^the_fingerprint_is_of_what_the_request_means$",
		},
		{
			Name: "decoded-body-unbounded", File: "idempotency/encoding.go",
			Note:    "a small compressed body may decode to any size",
			Anchor:  "io.ReadAll(io.LimitReader(zr, limit+1))",
			Replace: "io.ReadAll(zr)",
			Pkg:     "./idempotency", Run: "^TestContent$/^the_fingerprint_is_of_what_the_request_means$",
		},
		{
			Name: "unknown-encoding-taken-raw", File: "idempotency/encoding.go",
			Note:    "a coding the middleware does not know is skipped, and the body fingerprinted as sent",
			Anchor:  `return nil, fmt.Errorf("%w: %q; this server decodes %s", errUnsupportedEncoding, clip(c), acceptEncoding)`,
			Replace: `continue`,
			Pkg:     "./idempotency", Run: "^TestContent$/^the_fingerprint_is_of_what_the_request_means$",
		},
		{
			Name: "codings-undone-in-sent-order", File: "idempotency/encoding.go",
			Note:    "stacked codings are undone first first, not last first",
			Anchor:  "for i := len(list) - 1; i >= 0; i-- {",
			Replace: "for i := range list {",
			Pkg:     "./idempotency", Run: "^TestContent$/^the_fingerprint_is_of_what_the_request_means$",
		},
		{
			Name: "lone-surrogates-read-as-fffd", File: "idempotency/internal/canonjson/canonjson.go",
			Note:    "a surrogate escape without its other half is read as U+FFFD, so \\ud800 and \\udbff share a fingerprint",
			Anchor:  "if utf16.IsSurrogate(rune(u)) {",
			Replace: "if false && utf16.IsSurrogate(rune(u)) {",
			Pkg:     "./idempotency", Run: "^(TestContent|TestFingerprint)$/^(JSON_is_UTF-8_or_refused_with_a_4xx|JSON_is_read_as_UTF-8_or_refused)$",
		},
		{
			Name: "invalid-utf8-read-as-fffd", File: "idempotency/internal/canonjson/canonjson.go",
			Note:    "bytes that are not UTF-8 in a JSON string are read as U+FFFD, so two such bodies share a fingerprint",
			Anchor:  "if err == nil && !utf8.Valid(body) {",
			Replace: "if false {",
			Pkg:     "./idempotency", Run: "^(TestContent|TestFingerprint)$/^(JSON_is_UTF-8_or_refused_with_a_4xx|JSON_is_read_as_UTF-8_or_refused)$",
		},
		{
			Name: "json-charset-ignored", File: "idempotency/encoding.go",
			Note:    "a JSON body declared in another charset is fingerprinted as if it were UTF-8",
			Anchor:  `if !declared || err == nil && strings.EqualFold(charset, "utf-8") {`,
			Replace: `if _, _ = charset, declared; true {`,
			Pkg:     "./idempotency", Run: "^TestContent$/^JSON_is_UTF-8_or_refused_with_a_4xx$",
		},
		{
			Name: "charset-refused-for-any-body", File: "idempotency/encoding.go",
			Note:    "a body that is not JSON is refused for its charset too",
			Anchor:  `if !isJSON && mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json") {`,
			Replace: `if _ = mediaType; false {`,
			Pkg:     "./idempotency", Run: "^TestContent$/^JSON_is_UTF-8_or_refused_with_a_4xx$",
		},
		{
			Name: "stored-answers-unbounded", File: "idempotency/middleware.go",
			Note:    "a record keeps an answer body of any size",
			Anchor:  "case int64(cw.body.Len()) > m.cfg.MaxStoredBodyBytes:",
			Replace: "case false:",
			Pkg:     "./idempotency", Run: "^TestKeyedAnswer$/^a_stored_answer_is_bounded_and_never_keeps_a_secret$",
		},
		{
			Name: "confidential-answers-kept", File: "idempotency/middleware.go",
			Note:    "a record keeps the body of an answer Config.Confidential names",
			Anchor:  "case m.cfg.Confidential != nil && m.cfg.Confidential(r):",
			Replace: "case false:",
			Pkg:     "./idempotency", Run: "^TestKeyedAnswer$/^a_stored_answer_is_bounded_and_never_keeps_a_secret$",
		},
		{
			Name: "omitted-body-unmarked", File: "idempotency/middleware.go",
			Note:    "a replay without its body does not say the body was not kept",
			Anchor:  "resp.Header.Set(headerBodyOmitted, omitted)",
			Replace: "",
			Pkg:     "./idempotency", Run: "^TestKeyedAnswer$/^a_stored_answer_is_bounded_and_never_keeps_a_secret$",
		},
		{
			// The simulated server echoes the key itself, as received
			// (it rewrites keys to compare them raw).
			Name: "no-key-echo", File: "idempotency/middleware.go",
			Note:    "the middleware's answers do not carry the request's key back",
			Anchor:  "	w = echoKey(w, r)\n",
			Replace: "",
			Pkg:     "./idempotency", Run: "^TestKeyedAnswer$/^every_answer_echoes_the_key$",
		},
		{
			Name: "lease-judged-on-host-clock", File: "idempotency/middleware.go",
			Note:    "the middleware judges a record's lease on its host's clock, not the store's: a host behind keeps a dead worker's key, one ahead tries to take a live one",
			Anchor:  "at := storeNow(existing, now)",
			Replace: "at := now",
			Pkg:     "./idempotency", Run: "^TestLease$/^leases_are_judged_on_the_store's_clock$",
		},
		{
			Name: "retry-after-on-host-clock", File: "idempotency/middleware.go",
			Note:    "a 409's Retry-After counts the lease's time left on the host's clock",
			Anchor:  "m.inProgress(w, r, existing, at)",
			Replace: "m.inProgress(w, r, existing, now)",
			Pkg:     "./idempotency", Run: "^TestLease$/^leases_are_judged_on_the_store's_clock$",
		},
		{
			Name: "memory-read-at-missing", File: "idempotency/memory.go",
			Note:    "the memory store returns a live record without its now, so the middleware judges its lease on the host's clock",
			Anchor:  "cp.ID, cp.ReadAt = rec.ID, now",
			Replace: "cp.ID = rec.ID",
			Pkg:     "./idempotency", Run: "^TestLease$/^leases_are_judged_on_the_store's_clock$",
		},
		{
			Name: "store-timeout-answered-500", File: "idempotency/middleware.go",
			Note:    "a store call past its bound is a 500 without Retry-After, not a 503 to retry",
			Anchor:  "if errors.Is(err, context.DeadlineExceeded) {\n\t\t// The store's wait",
			Replace: "if false {\n\t\t// The store's wait",
			Pkg:     "./idempotency", Run: "^TestStoreFailure$/^a_store_without_an_answer_is_a_503$",
		},
		{
			Name: "unavailable-said-to-be-a-standby", File: "idempotency/middleware.go",
			Note:    "a store that cannot decide is answered as a standby, which a rolled-back conflict after the handler ran is not",
			Anchor:  `"the server's database could not complete this request now")`,
			Replace: `"the server cannot read its idempotency records from its primary database now")`,
			Pkg:     "./idempotency", Run: "^TestStoreFailure$/^a_store_that_cannot_settle_is_a_503$",
		},
		{
			Name: "full-retry-after-on-host-clock", File: "idempotency/middleware.go",
			Note:    "a full store's Retry-After counts the time to its earliest expiry on the host's clock",
			Anchor:  "now := fe.Now\n",
			Replace: "now := time.Time{}\n",
			Pkg:     "./idempotency", Run: "^TestLease$/^leases_are_judged_on_the_store's_clock$",
		},
	})
}
