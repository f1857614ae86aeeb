// Package idempotency is the server side of the Idempotency-Key contract as
// net/http middleware over a small record store. The fake server of
// [github.com/idemkit/idem/fakeserver] is built on it; a production server
// can use it with its own [Store] (for example one over PostgreSQL).
//
// # The checks
//
// [New] wraps a handler for an endpoint that requires a key. For each
// request it answers, in this order (a problem's type is
// https://idem.dev/problems/ followed by the name given here, as
// docs/CONTRACT.md lists them):
//
//   - no Idempotency-Key: 400, type idempotency-key-missing; nothing stored.
//   - a key it cannot accept: 400, type idempotency-key-invalid; nothing stored.
//   - a body over [Config.MaxBodyBytes], as sent or as decoded: 413, type
//     payload-too-large; a Content-Encoding other than gzip, deflate and
//     identity: 415, type unsupported-media-type, with Accept-Encoding; a
//     body that does not decode: 400, type bad-request; a JSON body
//     declared in a charset other than UTF-8: 415, type
//     unsupported-media-type; a JSON body without one reading (see
//     "Fingerprint"): 400, type bad-request; a body that
//     [Config.Validate] rejects: its 400 problem. Nothing is stored, so the
//     key stays free, even when the key already has a record.
//   - a new key the store has no room for ([ErrStoreFull]): 503, type
//     storage-full, with Retry-After when the store says when room is
//     expected (an error matching [ErrStoreFull]); nothing is stored and the handler does not run.
//   - a record with another fingerprint (method, path, query or body): 422,
//     type idempotency-key-reused.
//   - a COMPLETED record: its stored status, headers and body, byte for byte,
//     plus Idempotent-Replayed: true. A record whose answer body was over
//     [Config.MaxStoredBodyBytes] or [Config.Confidential] kept no body:
//     its replay has the status, Content-Type and Location, an empty body
//     and Idempotent-Body-Omitted: too-large or confidential.
//   - an IN_PROGRESS record whose lease is alive: 409, type
//     request-in-progress, with Retry-After.
//   - an IN_PROGRESS record whose lease has ended: the record is taken over
//     atomically and the handler runs with [Info.Takeover] set.
//   - no live record: the handler runs as the record's owner.
//
// Every one of these answers to a request that carries an Idempotency-Key
// (a 400 about the key and a 5xx included) carries the key back in an
// Idempotency-Key header field, as received, bare or quoted: the server's
// mark on its answers, which no proxy, CDN or captive portal in front of
// it puts on its own. Clients settle an intent only on marked answers. A
// server's lookup by key answers its miss with a 404 of type
// https://idem.dev/problems/idempotency-key-unused, which it writes itself
// (a [Problem] and its Write).
//
// # The key
//
// The middleware accepts the RFC 8941 sf-string form of the IETF draft ("K") and
// the bare form deployed APIs send (K), as the same key. A key is 1 to 255
// characters of visible ASCII; with [Config.RequireUUID] it must also be a
// UUID in its 36-character form, and it is compared by its canonical form
// (uuid.Parse(k).String(), lower case): a key in upper case and its
// lower-cased retry are one key. Without RequireUUID keys are compared
// byte for byte. Every answer echoes the key as its request sent it.
// A server that serves its own lookup by key reads the key with
// [ParseKey] and compares it in [CanonicalKey]'s form, as the middleware
// does.
//
// # Scope
//
// Keys are scoped to the account the request acts for, which
// [Config.Principal] returns, as the server's authentication found it: two
// callers that pick the same key never see each other's records, and every
// token of one account is the same caller. Principal is required and has
// no default: the only one there could be, the raw Authorization value,
// makes a refreshed OAuth token (or a rotated API key) another caller,
// whose retry finds no record and runs the work again.
//
// # What a store keeps
//
// A store keeps the [PrincipalDigest] of each record's principal, never the
// principal, which a server may have made a credential: an unkeyed,
// domain-separated SHA-256 ("idem.principal.v1:" then the principal), so
// that the records, their backups and their logs hold no token, a long
// principal (a 3,000-character token) fits any index, every process
// computes the same digest without a shared secret, and no key rotation
// can orphan a live record. The storetest suite checks both.
//
// # The race
//
// No request looks a key up and then inserts it. [Store.Insert] is one
// atomic insert-or-conflict, as a PRIMARY KEY decides it; the loser gets the
// existing record and answers from it. A takeover is a compare-and-swap on
// the lease owner ([Store.TakeOver]): of many requests that find one dead
// worker's record, exactly one wins.
//
// # Commit hook
//
// The effect of a request and its COMPLETED record commit together or not
// at all. The handler does not change business state directly: it registers
// its effect with [OnCommit], and the middleware hands the effects to
// [Store.Complete], which runs them and marks the record COMPLETED in one
// atomic step (under the store's lock; a SQL store would run them in the
// transaction that updates the record). If the handler answers a server
// error (>= 500), or the commit fails, the effects are dropped and no answer
// is stored; a retry does the work. The handler may have called an external
// provider under the record's stable id first (a call that timed out may
// have charged), so the record stays IN_PROGRESS with its lease ended, and
// the next request takes it over with the same stable id (and asks the
// provider first). A handler that did nothing outside the store says so
// with [NothingDone]; then the record is released ([Store.Release]) and the
// key is free again, except in a takeover, whose dead worker may have. If the
// worker lost its record meanwhile (its lease was taken over, or the record
// expired), the effects are dropped and the answer is 409; a retry gets the
// new owner's answer.
//
// The handler's answer is buffered until the commit, so a client never sees
// an answer whose effect was not recorded. Only Content-Type and Location are
// stored with the status and body: a stored response may hold sensitive data,
// and a replay needs nothing more.
//
// # External side effects
//
// Work outside the store (a payment provider) cannot share its transaction.
// Each record gets a stable id of the server's own ([Record.StableID]), kept
// across takeovers and exposed as [Info.StableID]: the handler passes it to
// the provider as the provider's idempotency key, so a repeated call is a
// duplicate there too. A handler running a takeover ([Info.Takeover]) must
// ask the provider what it did for StableID before doing it again.
//
// # One transaction
//
// When every effect of a handler is a write to the store's own database,
// [Config.OneTransaction] runs each fresh key's request in one transaction
// of a [TxStore]: the record, the effect and the answer commit once, a
// crash before the commit leaves nothing behind, and no lease is needed.
// Duplicates answer 409 at once, holding no connection: one request per
// key runs in a process, and across processes the store's lock on the key
// is taken without waiting. The handler must not end the transaction it
// is given: one that commits or rolls it back gets 500, and nothing is
// stored. A record the lease mode left IN_PROGRESS (the two modes share
// the store) answers 409 while its lease lives; after, the request takes
// it over in its transaction, with its stable id and [Info.Takeover] set.
// Handlers that call anything outside the database keep the lease mode
// below.
//
// # Crashes and leases
//
// In the lease mode (the default), a panic in the handler (a crashed
// worker) is not recovered: the record stays IN_PROGRESS, as a dead
// process would leave it, and requests get 409 until its lease
// ([Config.Lease]) ends and one of them takes it over. The lease must be
// longer than the work takes; it is not extended while the work runs.
//
// Leases and retention are judged on the store's clock, one for every
// process that shares the store (PostgreSQL's clock_timestamp() for
// [github.com/idemkit/idem/idempotency/pgstore]), never on the clock of the
// host a request reaches: a host whose clock is 30 seconds ahead does not
// see a live lease as ended, and does not run the work a second time.
// A record the store returns carries the store's now ([Record.ReadAt]):
// the middleware judges the lease, the take-over and a 409's Retry-After
// against it, never against its host's clock. [Config.Clock] gives the
// durations (the lease, the retention); a test that moves time gives its
// store a clock of its own ([MemoryStore.Clock], pgstore's
// Options.Clock).
//
// # Store errors
//
// When the store fails (a statement timeout, a lost connection, a dropped
// table), the answer is 500, type internal-error, with a detail that says
// nothing internal: a database's message names tables, indexes and
// settings, and the client needs none of them. The error itself goes to
// [Config.Logger] (silent when nil) and [Config.OnOutcome] is told
// "store_error".
//
// A store that does not answer within its bound returns an error matching
// context.DeadlineExceeded (pgstore bounds every wait for the database):
// the answer is then 503 with Retry-After: 1, type internal-error, and
// never the handler's answer. Before the handler ran, nothing was done.
// After it, the commit may have happened: the retry with the key finds
// the stored answer, or does the work.
//
// # Retry-After
//
// A 409 carries Retry-After in whole seconds: the time left until the work
// is expected to be done ([Config.Expected] after the lease began), capped at
// the end of the lease, rounded up, and at least 1.
//
// # Retention
//
// A record lives for [Config.Retention] (default 24 hours) from its
// CreatedAt. From then on it counts as absent: [Store.Insert] replaces it,
// and the key is new again. An IN_PROGRESS record under a live lease is not
// expired until that lease ends (see [Record.Expired]): a worker that took
// it over just before its retention ended keeps it. [Store.Sweep] deletes expired records; run it on
// a schedule. A store may also bound its records ([ErrStoreFull];
// [MemoryStore.MaxRecords]).
//
// # Fingerprint
//
// The fingerprint is SHA-256 over the method, the path, the query string
// and the body. The body is taken as its Content-Encoding decodes (gzip,
// whose header holds a time, and deflate): a retry compressed again is the
// same request. A JSON body is canonicalised first: members sorted by their
// case-folded names, whitespace dropped, strings as encoding/json decodes
// them; numbers are kept as written. Other bodies are hashed raw. The work
// and memory are linear in the body's size, whatever its nesting.
//
// JSON is UTF-8 (RFC 8259). A JSON body declared in another charset, or
// with bytes that are not UTF-8, or with a surrogate escape without its
// other half (\ud800), is refused: encoding/json reads such text as
// U+FFFD, so two bodies a client tells apart would share a fingerprint.
//
// The query is taken as a handler reads it through url.Values: parameters
// split on '&', names and values decoded as url.QueryUnescape decodes them
// ('+', %20 and a space are one; %7E and '~' are one; "a" and "a=" are
// one), then ordered by name. The order of parameters does not matter:
// ?a=1&b=2 and ?b=2&a=1 replay each other. The order of a repeated name's
// values does: ?a=1&a=2 and ?a=2&a=1 are two requests (url.Values.Get
// reads the first). A parameter that does not decode (a bad %-escape, or a
// ';') is taken as written. A handler that reads r.URL.RawQuery itself,
// rather than url.Values, must read it in a way these rules preserve.
//
// Each record stores the version of the algorithm its fingerprint was made
// with ([Record.FingerprintVersion]): 1, the algorithm above. A record of
// another version never matches a request: a key reused with it is 422,
// whatever the body. A release that changes the algorithm numbers it 2.
//
// Two bodies that a handler reads differently must never share a
// fingerprint, or a key reused for a changed body would replay the first
// answer instead of a 422. Sorting members is safe only while every object
// has one reading, and encoding/json (like many decoders) matches member
// names to struct fields case-insensitively, keeping the last match:
// {"amount":1500,"AMOUNT":2000} is a payment of 2000, and the same members
// in the other order one of 1500. Its folding goes beyond ASCII: "cuſtomer"
// (long s) and "Key" (Kelvin sign) match "customer" and "key". So the
// middleware refuses, with 400 and type bad-request, a JSON body with
// an object, at any depth, whose member names are equal after that folding
// (exact duplicates included); with that, member order changes no reading.
// Across bodies, names keep their case: {"A":1} and {"a":1} have different
// fingerprints (a handler that decodes into a map reads them differently),
// so a retry must resend the body it sent, not a re-cased copy.
//
// A JSON body whose objects and arrays nest deeper than [Config.MaxDepth]
// (100 unless set) is refused the same way, before
// [Config.Validate] reads it.
package idempotency
