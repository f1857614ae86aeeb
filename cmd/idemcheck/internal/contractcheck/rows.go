package contractcheck

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
)

// RowInfo describes a row for documentation: what it checks and what a FAIL
// costs a client.
type RowInfo struct {
	ID    string
	Title string
	Cost  string
}

// Rows lists the rows in the order they run.
func Rows() []RowInfo {
	out := make([]RowInfo, len(rows))
	for i, r := range rows {
		out[i] = RowInfo{ID: r.id, Title: r.title, Cost: r.cost}
	}
	return out
}

// Each rule is judged by one row only, so that a server that breaks one
// rule fails one row: the Idempotent-Replayed marker of a repeat is judged
// by "replay" and that of a fresh answer by "fresh-not-replayed"; the other
// rows tell a replay from new work by the resource the answer names
// (Location, else the body's id, else the body), never by the marker, and a
// 409's Retry-After is judged by "concurrent" alone.

// rowDef is one row: what it checks, how many requests it may send, and the
// check itself.
type rowDef struct {
	id, title, cost string
	// plan returns the most requests the row sends and how many records it
	// creates on a server that keeps the contract.
	plan func(c *config) (requests, records int)
	// run judges the row. A Row with no Status stops the whole check: the
	// server does not accept the body at all.
	run func(c *checker, ctx context.Context) Row
}

func fixed(requests, records int) func(*config) (int, int) {
	return func(*config) (int, int) { return requests, records }
}

var rows = []rowDef{
	{id: "baseline", title: "a fresh key and the body are accepted (2xx)",
		cost: "nothing else can be judged; check -url, -body and -auth",
		plan: func(c *config) (int, int) {
			if c.admin != "" {
				return 2, 1 // the request and the probe of the admin endpoints
			}
			return 1, 1
		},
		run: (*checker).rowBaseline},
	{id: "key-missing", title: "no Idempotency-Key: 400 idempotency-key-missing",
		cost: "a client that forgot the key is served without protection and never learns it; its retries charge twice",
		plan: fixed(1, 0), run: func(c *checker, ctx context.Context) Row {
			return c.refused(c.post(ctx, c.cfg.Body), "idempotency-key-missing")
		}},
	{id: "key-empty", title: "an empty key: 400 idempotency-key-invalid",
		cost: "a client with a broken key generator is served without protection",
		plan: fixed(1, 0), run: func(c *checker, ctx context.Context) Row {
			return c.refused(c.post(ctx, c.cfg.Body, ""), "idempotency-key-invalid")
		}},
	{id: "key-too-long", title: "a key of 256 characters: 400 idempotency-key-invalid",
		cost: "an over-long key may be cut short by the store, so two intents share one key",
		plan: fixed(1, 0), run: func(c *checker, ctx context.Context) Row {
			k := c.cfg.NewKey()
			long := k + strings.Repeat("x", max(0, 256-len(k)))
			return c.refused(c.post(ctx, c.cfg.Body, long[:256]), "idempotency-key-invalid")
		}},
	{id: "key-control-char", title: "a key with a control character (tab): 400 idempotency-key-invalid",
		cost: "keys that logs, proxies and stores mangle differently stop matching across retries",
		plan: fixed(1, 0), run: func(c *checker, ctx context.Context) Row {
			k := c.cfg.NewKey()
			return c.refused(c.post(ctx, c.cfg.Body, k[:len(k)/2]+"\t"+k[len(k)/2:]), "idempotency-key-invalid")
		}},
	{id: "key-twice", title: "the header sent twice: 400 idempotency-key-invalid",
		cost: "the server picks one of two keys; a retry may match the other and run again",
		plan: fixed(1, 0), run: func(c *checker, ctx context.Context) Row {
			return c.refused(c.post(ctx, c.cfg.Body, c.cfg.NewKey(), c.cfg.NewKey()), "idempotency-key-invalid")
		}},
	{id: "replay", title: "the same request again: the stored status, Location, Content-Type and body, Idempotent-Replayed: true",
		cost: "a retry after a lost response does not get the original answer, or cannot tell it is one",
		plan: fixed(1, 0), run: (*checker).rowReplay},
	{id: "quoted-bare", title: `"K" and K are one key`,
		cost: "a client or proxy that quotes the key (the IETF draft's form) gets a second charge",
		plan: fixed(2, 1), run: (*checker).rowQuotedBare},
	{id: "reserialised-json", title: "the same JSON re-serialised (other member order, whitespace) is the same request",
		cost: "a client that re-encodes its body on retry gets 422 and never learns the outcome",
		plan: jsonOnly(2, 1), run: (*checker).rowReserialised},
	{id: "changed-body", title: "the key reused with another body: 422 idempotency-key-reused",
		cost: "a new intent that reuses a key by mistake gets the old answer: the app thinks it paid, and did not",
		plan: func(c *config) (int, int) {
			if c.ChangedBody != nil {
				return 2, 1
			}
			return jsonOnly(2, 1)(c)
		},
		run: (*checker).rowChangedBody},
	{id: "concurrent", title: "concurrent duplicates: one does the work, the rest 409 with Retry-After or a replay",
		cost: "a double-tap or an early retry charges twice",
		plan: func(c *config) (int, int) {
			if c.admin != "" {
				return c.Concurrency + 1, 1
			}
			return c.Concurrency, 1
		},
		run: (*checker).rowConcurrent},
	{id: "scoping", title: "two callers with the same key do not see each other's records",
		cost: "one customer receives another's stored answer (a data leak), and the second customer's payment is never made",
		plan: func(c *config) (int, int) {
			if c.Auth2 == "" {
				return 0, 0
			}
			return 2, 2
		},
		run: (*checker).rowScoping},
	{id: "validation-key-free", title: "a request refused by validation leaves its key free",
		cost: "a client that fixes its body and retries with the same key is refused for good",
		plan: func(c *config) (int, int) {
			if c.InvalidBody != nil {
				return 2, 1
			}
			return jsonOnly(2, 1)(c)
		},
		run: (*checker).rowValidation},
	{id: "lookup", title: "the lookup by key finds the request made under it, and 404 for an unused key",
		cost: "a client whose outcome stayed unknown cannot settle it without resending",
		plan: func(c *config) (int, int) {
			if c.Lookup == "" {
				return 0, 0
			}
			return 2, 0
		},
		run: (*checker).rowLookup},
	{id: "5xx-not-stored", title: "a 5xx is not stored: a retry does the work",
		cost: "a passing server error becomes the permanent answer for the key; the payment is never made",
		plan: adminOnly(3, 1), run: (*checker).row5xx},
	{id: "dead-worker", title: "a dead worker's record: 409 while its lease lives, then taken over, charged once",
		cost: "a crash mid-payment either blocks the key for good or charges a second time",
		plan: func(c *config) (int, int) {
			if c.admin == "" {
				return 0, 0
			}
			// fault, stats twice, the crash, the first retry, the waits'
			// retries, the replay.
			return 6 + maxWaits(c.LeaseWait), 1
		},
		run: (*checker).rowDeadWorker},
	{id: "key-echo", title: "every answer to a keyed request echoes its Idempotency-Key as received, and every lookup answer the key of its query, with Cache-Control: no-store",
		cost: "a client cannot tell the server's answers from a proxy's, a CDN's or a captive portal's: a careful client (idem) leaves a retry's refusal, a first 2xx and every lookup answer unsettled, and the outcome stays unknown; a careless one takes a gateway's 401 for \"not paid\" and charges twice; a cached lookup answer can be served after the payment changed",
		plan: func(c *config) (int, int) {
			if c.Lookup == "" {
				return 3, 1
			}
			return 5, 1
		},
		run: (*checker).rowKeyEcho},
	{id: "lookup-miss", title: "the lookup's miss is 404 idempotency-key-unused, a type no other 404 has",
		cost: "a client cannot tell \"nothing was done under this key\" from a proxy's or CDN's own 404: a careful client (idem) never voids an expired intent whose outcome is unknown, so its user cannot pay again; a careless one voids a payment that was made and charges twice",
		plan: func(c *config) (int, int) {
			if c.Lookup == "" {
				return 0, 0
			}
			return 2, 0
		},
		run: (*checker).rowLookupMiss},
	{id: "fresh-not-replayed", title: "a fresh answer is never marked Idempotent-Replayed",
		cost: "a client takes a new payment for the replay of an old one, and reports it wrong",
		plan: fixed(0, 0), run: (*checker).rowFresh},
}

func jsonOnly(requests, records int) func(*config) (int, int) {
	return func(c *config) (int, int) {
		if _, err := jsonObject(c.Body); err != nil {
			return 0, 0
		}
		return requests, records
	}
}

func adminOnly(requests, records int) func(*config) (int, int) {
	return func(c *config) (int, int) {
		if c.admin == "" {
			return 0, 0
		}
		return requests, records
	}
}

func pass(format string, a ...any) Row { return Row{Status: Pass, Detail: fmt.Sprintf(format, a...)} }
func skip(format string, a ...any) Row { return Row{Status: Skip, Detail: fmt.Sprintf(format, a...)} }
func fail(detail string, exs ...*exchange) Row {
	return Row{Status: Fail, Detail: detail, Evidence: evidence(exs...)}
}

// freshFirst sends body with a fresh key and requires a 2xx; the answer is
// remembered for the fresh-not-replayed row. row is non-nil when it failed.
func (c *checker) freshFirst(ctx context.Context, key string, body []byte) (*exchange, *Row) {
	ex := c.post(ctx, body, key)
	if !ex.ok() {
		r := fail("the first request with a fresh key was not accepted (2xx) as the baseline was", ex)
		return ex, &r
	}
	c.fresh = append(c.fresh, ex)
	return ex, nil
}

func (c *checker) rowBaseline(ctx context.Context) Row {
	ex := c.post(ctx, c.cfg.Body, c.cfg.NewKey())
	if !ex.ok() {
		return Row{Detail: fmt.Sprintf("the server did not accept the body with a fresh key: %s %s -> %s; give -body a request it accepts, and -auth if it needs a credential",
			c.cfg.Method, c.cfg.URL, ex.describeResponse())}
	}
	c.baseline = ex
	c.fresh = append(c.fresh, ex)
	return pass("%d %s", ex.status, ex.resource())
}

// refused judges a request the server must refuse with 400 and the problem
// type name.
func (c *checker) refused(ex *exchange, name string) Row {
	if why := c.wantProblem(ex, http.StatusBadRequest, name); why != "" {
		return fail(why, ex)
	}
	return pass("400 %s", name)
}

func (c *checker) rowReplay(ctx context.Context) Row {
	first := c.baseline
	again := c.post(ctx, c.cfg.Body, first.req.keys...)
	var wrong []string
	switch {
	case !again.answered():
		return fail("the same request got no answer", first, again)
	case again.status != first.status:
		wrong = append(wrong, fmt.Sprintf("status %d, not %d", again.status, first.status))
	}
	if again.header.Get("Location") != first.header.Get("Location") {
		wrong = append(wrong, fmt.Sprintf("Location %q, not %q", again.header.Get("Location"), first.header.Get("Location")))
	}
	if again.header.Get("Content-Type") != first.header.Get("Content-Type") {
		wrong = append(wrong, fmt.Sprintf("Content-Type %q, not %q", again.header.Get("Content-Type"), first.header.Get("Content-Type")))
	}
	if string(again.body) != string(first.body) {
		wrong = append(wrong, "another body")
	}
	if !again.replayed() {
		wrong = append(wrong, "no Idempotent-Replayed: true")
	}
	if len(wrong) > 0 {
		return fail("the repeat is not the stored answer: "+strings.Join(wrong, "; "), first, again)
	}
	return pass("%d, same Location, Content-Type and body, Idempotent-Replayed: true", again.status)
}

func (c *checker) rowQuotedBare(ctx context.Context) Row {
	k := c.cfg.NewKey()
	first, r := c.freshFirst(ctx, k, c.cfg.Body)
	if r != nil {
		return *r
	}
	quoted := c.post(ctx, c.cfg.Body, `"`+k+`"`)
	if !sameAnswer(first, quoted) {
		what := "an answer other than the stored one"
		if quoted.ok() && quoted.resource() != first.resource() {
			what = "a second resource: the quoted form was not taken as the same key"
		}
		return fail(fmt.Sprintf("%s then %s got %s", k, `"`+k+`"`, what), first, quoted)
	}
	return pass(`K then "K": the stored answer`)
}

func (c *checker) rowReserialised(ctx context.Context) Row {
	other, err := reserialise(c.cfg.Body)
	if err != nil {
		return skip("%v; give a JSON object as -body", err)
	}
	k := c.cfg.NewKey()
	first, r := c.freshFirst(ctx, k, c.cfg.Body)
	if r != nil {
		return *r
	}
	again := c.post(ctx, other, k)
	if !sameAnswer(first, again) {
		what := "an answer other than the stored one"
		if again.answered() && again.status == http.StatusUnprocessableEntity {
			what = "422: the server fingerprints the bytes, not the JSON"
		}
		return fail("the same JSON object, re-serialised, got "+what, first, again)
	}
	return pass("members reversed and spaced: the stored answer")
}

func (c *checker) rowChangedBody(ctx context.Context) Row {
	changed := c.cfg.ChangedBody
	if changed == nil {
		var err error
		if changed, err = changeBody(c.cfg.Body); err != nil {
			return skip("cannot derive a changed body (%v); give -changed-body", err)
		}
	}
	k := c.cfg.NewKey()
	first, r := c.freshFirst(ctx, k, c.cfg.Body)
	if r != nil {
		return *r
	}
	again := c.post(ctx, changed, k)
	if again.answered() && again.status == http.StatusBadRequest && c.cfg.ChangedBody == nil {
		return skip("the derived changed body %s was refused as invalid (400); give -changed-body with a valid body that differs", clip(changed))
	}
	if why := c.wantProblem(again, http.StatusUnprocessableEntity, "idempotency-key-reused"); why != "" {
		if sameAnswer(first, again) || (again.ok() && again.resource() == first.resource()) {
			why += ": the first request's answer was given for another body"
		}
		return fail(why, first, again)
	}
	return pass("422 idempotency-key-reused")
}

func (c *checker) rowConcurrent(ctx context.Context) Row {
	k := c.cfg.NewKey()
	how := "sent at once"
	if ok, _ := c.useAdmin(ctx); ok {
		// Hold the work, so that the duplicates find the key in progress.
		if _, ok := c.inject(ctx, fault{Fault: "delay", Key: k, DelayMS: concurrentDelay.Milliseconds()}); ok {
			how = fmt.Sprintf("sent at once, the first held %v by the delay fault", concurrentDelay)
		}
	}
	n := c.cfg.Concurrency
	exs := make([]*exchange, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			exs[i] = c.post(ctx, c.cfg.Body, k)
		})
	}
	close(start)
	wg.Wait()

	resources := map[string]int{}
	var wrong []string
	conflicts := 0
	for _, ex := range exs {
		switch {
		case ex.ok():
			resources[ex.resource()]++
		case ex.answered() && ex.status == http.StatusConflict:
			conflicts++
			if why := c.wantProblem(ex, http.StatusConflict, "request-in-progress"); why != "" {
				wrong = append(wrong, "a 409: "+why)
			}
			if _, ok := ex.retryAfter(); !ok {
				wrong = append(wrong, fmt.Sprintf("a 409 without Retry-After in whole seconds >= 1 (got %q)", ex.header.Get("Retry-After")))
			}
		default:
			wrong = append(wrong, "an answer that is neither 2xx nor 409: "+ex.describeResponse())
		}
	}
	switch len(resources) {
	case 1:
	case 0:
		wrong = append(wrong, "no request did the work")
	default:
		names := make([]string, 0, len(resources))
		for r := range resources {
			names = append(names, r)
		}
		sort.Strings(names)
		wrong = append(wrong, fmt.Sprintf("the work was done %d times: %s", len(resources), strings.Join(names, ", ")))
	}
	if len(wrong) > 0 {
		return fail(fmt.Sprintf("%d requests with one key %s: %s", n, how, strings.Join(dedupe(wrong), "; ")), exs...)
	}
	return pass("%d at once: one did the work, %d got 409 with Retry-After, %d its stored answer", n, conflicts, n-conflicts-1)
}

func dedupe(ss []string) []string {
	seen := map[string]bool{}
	out := ss[:0]
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func (c *checker) rowScoping(ctx context.Context) Row {
	if c.cfg.Auth2 == "" {
		return skip("give -auth2 (a second caller's Authorization) to check scoping")
	}
	k := c.cfg.NewKey()
	first, r := c.freshFirst(ctx, k, c.cfg.Body)
	if r != nil {
		return *r
	}
	other := c.send(ctx, request{method: c.cfg.Method, url: c.cfg.URL, keys: []string{k}, caller: 2, body: c.cfg.Body})
	switch {
	case other.answered() && (other.status == http.StatusUnauthorized || other.status == http.StatusForbidden):
		return skip("the server refused -auth2 (%d); give a second credential it accepts", other.status)
	case !other.ok():
		return fail("the second caller's request with the first caller's key was not done (2xx)", first, other)
	case other.resource() == first.resource():
		return fail("the second caller got the first caller's record", first, other)
	}
	c.fresh = append(c.fresh, other)
	return pass("the second caller's request with the same key was done as its own")
}

func (c *checker) rowValidation(ctx context.Context) Row {
	invalid := c.cfg.InvalidBody
	if invalid == nil {
		var err error
		if invalid, err = invalidBody(c.cfg.Body); err != nil {
			return skip("cannot derive an invalid body (%v); give -invalid-body", err)
		}
	}
	k := c.cfg.NewKey()
	refused := c.post(ctx, invalid, k)
	switch {
	case !refused.answered():
		return fail("the invalid body got no answer", refused)
	case refused.status < 400 || refused.status >= 500 || refused.status == http.StatusConflict ||
		refused.status == http.StatusUnprocessableEntity:
		return skip("the invalid body %s was answered %d, not refused with a 4xx; give -invalid-body", clip(invalid), refused.status)
	}
	valid := c.post(ctx, c.cfg.Body, k)
	if !valid.ok() {
		return fail(fmt.Sprintf("after a %d for an invalid body, the valid request with the same key was not done: the refusal was stored", refused.status), refused, valid)
	}
	c.fresh = append(c.fresh, valid)
	return pass("%d for the invalid body, then %d for the valid one", refused.status, valid.status)
}

func (c *checker) rowLookup(ctx context.Context) Row {
	if c.cfg.Lookup == "" {
		return skip("no lookup endpoint given (-lookup URL with {key})")
	}
	lookup := func(key string) *exchange {
		u := strings.ReplaceAll(c.cfg.Lookup, "{key}", url.QueryEscape(key))
		return c.send(ctx, request{method: http.MethodGet, url: u, caller: 1})
	}
	made := c.baseline
	found := lookup(made.req.keys[0])
	if !found.answered() || found.status != http.StatusOK {
		return fail("the lookup of a key used for a done request did not answer 200", made, found)
	}
	if want, got := jsonID(made.body), jsonID(found.body); want != "" && got != want {
		return fail(fmt.Sprintf("the lookup answered id %q, the request made %q", got, want), made, found)
	}
	none := lookup(c.cfg.NewKey())
	if !none.answered() || none.status != http.StatusNotFound {
		return fail("the lookup of a key never used did not answer 404", none)
	}
	return pass("200 for a used key, 404 for an unused one")
}

func (c *checker) rowFresh(context.Context) Row {
	var marked []*exchange
	for _, ex := range c.fresh {
		if ex.replayed() {
			marked = append(marked, ex)
		}
	}
	if len(marked) > 0 {
		return fail(fmt.Sprintf("%d of %d fresh answers were marked Idempotent-Replayed", len(marked), len(c.fresh)), marked...)
	}
	return pass("%d fresh answers, none marked", len(c.fresh))
}

// echoes says what is wrong with the key echo of ex, an answer to a request
// that sent want as its Idempotency-Key field lines, or "" when it is
// right: the same lines, as received.
func echoes(ex *exchange, want []string) string {
	got := ex.header.Values(headerKey)
	switch {
	case len(got) == 0:
		return "no Idempotency-Key"
	case strings.Join(got, "\n") != strings.Join(want, "\n"):
		return fmt.Sprintf("Idempotency-Key %q, not %q as sent", strings.Join(got, ", "), strings.Join(want, ", "))
	}
	return ""
}

func (c *checker) lookupURL(key string) string {
	return strings.ReplaceAll(c.cfg.Lookup, "{key}", url.QueryEscape(key))
}

func (c *checker) rowKeyEcho(ctx context.Context) Row {
	k := c.cfg.NewKey()
	first, r := c.freshFirst(ctx, k, c.cfg.Body)
	if r != nil {
		return *r
	}
	quoted := c.post(ctx, c.cfg.Body, `"`+k+`"`)
	long := k + strings.Repeat("x", max(0, 256-len(k)))
	invalid := c.post(ctx, c.cfg.Body, long[:256])
	var wrong []string
	var bad []*exchange
	judged := 0
	c.keyedMu.Lock()
	keyed := append([]*exchange{first, quoted, invalid}, c.keyed...)
	c.keyedMu.Unlock()
	seen := map[*exchange]bool{}
	for _, ex := range keyed {
		if seen[ex] || !ex.answered() || ex.req.keys == nil {
			continue
		}
		seen[ex] = true
		judged++
		if why := echoes(ex, ex.req.keys); why != "" {
			wrong = append(wrong, fmt.Sprintf("a %d with %s", ex.status, why))
			bad = append(bad, ex)
		}
	}
	lookups := 0
	if c.cfg.Lookup != "" {
		for _, key := range []string{k, c.cfg.NewKey()} {
			ex := c.send(ctx, request{method: http.MethodGet, url: c.lookupURL(key), caller: 1})
			if !ex.answered() {
				continue
			}
			lookups++
			if why := echoes(ex, []string{key}); why != "" {
				wrong = append(wrong, fmt.Sprintf("a lookup's %d with %s", ex.status, why))
				bad = append(bad, ex)
			}
			if cc := ex.header.Get("Cache-Control"); !strings.Contains(strings.ToLower(cc), "no-store") {
				wrong = append(wrong, fmt.Sprintf("a lookup's %d with Cache-Control %q, not no-store", ex.status, cc))
				bad = append(bad, ex)
			}
		}
	}
	if len(wrong) > 0 {
		return fail("answers not marked as the server's: "+strings.Join(dedupe(wrong), "; "), bad...)
	}
	if c.cfg.Lookup == "" {
		return pass("%d answers to keyed requests, each with its key as sent (give -lookup to check the lookup's)", judged)
	}
	return pass("%d answers to keyed requests and %d lookup answers, each with its key as sent; the lookup's no-store", judged, lookups)
}

func (c *checker) rowLookupMiss(ctx context.Context) Row {
	if c.cfg.Lookup == "" {
		return skip("no lookup endpoint given (-lookup URL with {key}); without a typed miss, a client cannot void an intent")
	}
	none := c.send(ctx, request{method: http.MethodGet, url: c.lookupURL(c.cfg.NewKey()), caller: 1})
	if none.ok() {
		return skip("the lookup of a key never used answered %d, not 404: the lookup row judges that", none.status)
	}
	if why := c.wantProblem(none, http.StatusNotFound, "idempotency-key-unused"); why != "" {
		return fail("the lookup of a key never used: "+why, none)
	}
	// A 404 of the same server that is about something else (a path it
	// does not have) must not say "nothing was done under this key".
	u := *c.cfg.url
	u.Path = strings.TrimSuffix(u.Path, "/") + "/idemcheck-no-such-path/" + c.cfg.NewKey()
	u.RawQuery = ""
	other := c.send(ctx, request{method: http.MethodGet, url: u.String(), caller: 1})
	if other.answered() && other.problemType() == c.cfg.ProblemBase+"idempotency-key-unused" {
		return fail("a path the server does not have was answered with the lookup's typed miss: any 404 would then void an intent", none, other)
	}
	return pass("404 idempotency-key-unused for an unused key, and not for a path the server does not have")
}
