// Package fakeserver is a payment API that implements the server side of the
// Idempotency-Key contract exactly, faults included, for testing clients
// against. It runs in process, shaped like net/http/httptest ([NewServer],
// [NewHandler]), or as a program (go run ./cmd/fakeserver) for clients in
// any language. Importing it links neither a database driver nor the
// testing package; in a test:
//
//	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
//	t.Cleanup(srv.Close)
//
// [Options] is the one way to configure a server. [NewTLSServer] is the
// same server over HTTPS, as httptest.NewTLSServer is; its Client trusts
// it. [Options.Endpoints] serves the app's own endpoints (its POST
// /orders, say) behind the same idempotency layer and faults; see
// [Endpoint].
//
// The idempotency layer itself is the separate package
// [github.com/idemkit/idem/idempotency]; this package adds the
// business API, a fake payment provider, faults and counters.
//
// # The API
//
//   - POST /payments, key required. Body {"amount": 1500, "currency": "AZN",
//     "customer": "cus_1", "description": "..."}: amount an integer in minor
//     units, > 0; currency three letters; customer a non-empty string of
//     at most 255 characters; description optional, at most 1000
//     characters; other fields are rejected. Answers 201 with
//     Location: /payments/{id} and the payment. Customer "cus_declined" is
//     declined: 402, type [ProblemCardDeclined], stored and replayed like a
//     success, and nothing is charged.
//   - GET /payments/{id}: the caller's payment, or 404.
//   - GET /payments: {"data": [...]}, the caller's payments in order.
//   - GET /payments?idempotency_key=K: the payment made under the caller's
//     latest intent with K; 409 request-in-progress with
//     Retry-After while that intent is unsettled; or 404
//     idempotency-key-unused when nothing was charged for it, a type
//     no other 404 has. It is the lookup a client reconciles an unknown
//     outcome with; see "The lookup". Every answer of it carries K back in
//     an Idempotency-Key header field, as received, and Cache-Control:
//     no-store, so a client can tell it from a CDN's or a proxy's own.
//   - PUT /orders/{id}/status with {"status": "SHIPPED"} (at most 100
//     characters): naturally
//     idempotent; a key is ignored.
//
// Errors are RFC 9457 problems whose type is [ProblemCardDeclined], one of
// the fake's other types listed beside it, or one of the idempotency
// layer's. Every type is https://idem.dev/problems/ followed by the name
// given here, as docs/CONTRACT.md lists them.
//
// # Callers
//
// Keys, records, payments and orders are scoped to the account a request
// acts for, as a real server scopes them, not to its credential: a token
// refreshed between two attempts of a payment must not make the retry a
// new payment. The fake server has no users, so a test token names its
// account: "Bearer test_<account>_<anything>" (or "Bearer test_<account>"),
// the account 1 to 64 letters, digits, '-' or '.', its case significant,
// the scheme's not.
// "Bearer test_acme_1" and "Bearer test_acme_2" are the same caller, acme;
// "Bearer test_globex_1" is another. Any other Authorization value is an
// account of its own (so "Bearer ci-1" and "Bearer ci-2" are two callers,
// and a refresh of such a token is a new caller, as a server that scoped by
// the credential would have it); no Authorization is the anonymous caller.
// Tests that refresh tokens use test tokens.
//
// What the server keeps names the caller by a digest
// ([idempotency.PrincipalDigest]): the records, and on PostgreSQL the
// payments and orders tables, never hold a credential.
//
// # The provider
//
// A payment is charged by an in-process fake provider that has its own
// idempotency on the server's stable id for the intent (the payment id): a
// repeated charge for one id is a duplicate there. A request that takes over
// a dead worker's record asks the provider for that id first and charges
// only if it has no charge, so a crash at any point leaves at most one
// charge.
//
// # The lookup
//
// The lookup answers for the key's latest intent: a key used again after
// its record expired is a new intent, and the payment it made before is not
// its answer. While the key's record is live: a COMPLETED record answers its
// payment (404 after a decline); an IN_PROGRESS one answers 409 while its
// worker's lease is alive, and once the lease has ended (the worker died)
// the lookup recovers it as a takeover would: it takes the record over, asks
// the provider for its stable id, and if the provider charged it, records
// the payment, settles the record with the answer a resend then replays,
// and answers the payment. If the provider has no charge, the answer stays
// 409 until a resend with the key settles it. Once the record is gone, the
// key's latest intent to charge is asked about at the provider in the same
// way. The intent to charge (the payment id, the key, the description) is
// recorded before the provider is called; a sweep records the charges of
// dead workers' expired records before deleting them. So a charge is never
// left without a payment a lookup can find.
//
// # Faults
//
// [Handler.InjectFault] and POST /_fake/faults inject the faults of
// [FaultKind]. They match by key, caller and path, and count down per
// matching request. A status or reset fault answers first, and the other
// faults wait for a later request. Otherwise a matching request uses up
// one count of each matching fault kind. It does so even if it ends
// before the fault's point, as a replay does. A fault that could never
// strike is refused. Admin endpoints are never faulted.
//
// Beware when checking that a Go client sees a dropped or reset connection:
// net/http's Transport itself retries a POST that carries an Idempotency-Key
// when a reused keep-alive connection closes without an answer, so the first
// error may be hidden. Use a fresh connection to observe it.
//
// # Admin endpoints
//
// No key, no scoping, not counted:
//
//   - GET /_fake/stats: the [Stats] counters as JSON.
//   - POST /_fake/faults: {"fault", "key", "caller", "path", "count", "delay_ms",
//     "status", "retry_after"}; retry_after is a string or a number of
//     seconds. Answers 201 with the fault, or 400 naming what is wrong
//     (for an unknown fault, the valid names), or 503 storage-full
//     while 100 faults are pending.
//   - DELETE /_fake/faults, POST /_fake/sweep ({"deleted": N}),
//     POST /_fake/reset.
//
// # Several processes on PostgreSQL
//
// With [Options.Storage] set to [github.com/idemkit/idem/fakeserver/pgfake.New]
// (cmd/fakeserver -postgres DSN) the records go to a
// [github.com/idemkit/idem/idempotency/pgstore.Store], and payments, the
// intents to charge, the fake provider's charges, order statuses and the
// counters to tables beside them (pgfake.Migrate creates them). A payment commits
// in the transaction that marks its record COMPLETED. An intent to charge is
// a row (fake_intents) written before the provider is called, so that a
// process that dies after the provider charged leaves its charge to every
// other process, and to one started later. Leases and retention are judged
// on the database's clock, unless [Options.Clock] is set (tests), which every
// server on the database must then share. Cancelling the context given
// to pgfake.New ends the database work in flight, for a program whose
// drain time is over: cmd/fakeserver does, so that SIGTERM ends it within
// -shutdown-timeout even while a commit waits on a lock, and nothing
// commits after it stopped. Several fake server processes on one database
// then act as one server: a key's record, payment and charge are the same
// whichever process a request reaches, a dead worker's record in one process
// is taken over by a request to another once its lease ends, and
// /_fake/stats on any of them reports the database's totals. Faults stay per
// process; /_fake/reset empties the shared tables.
//
// # Time
//
// Retention, leases, created_at, payment ids and Retry-After use
// [Options.Clock]; give it the clock.Manual given to the client
// (idem.Config.Clock), so tests drive both without sleeping. ProcessingDelay and
// the delay fault wait in real time: they exist to make requests overlap.
// [Options.Sleep] replaces that wait, as a simulation's virtual clock does.
// [Options.NewID] makes the payment ids instead.
// Retry-After on a 409 is the processing delay still to go, capped at the
// lease, in whole seconds, at least 1.
//
// # Limits
//
// Every resource a caller can make the server hold is bounded.
// [Options.MaxRecords] and [Options.MaxPayments] bound records and
// payments: at either cap, POST /payments with a new key answers 503, type
// storage-full, before anything is stored or charged, so a client
// that retries it as an unknown outcome finds the key unused. Records free
// up as they expire (Retry-After says when); payments only with POST /_fake/reset.
// [Options.MaxOrders] bounds order statuses the same way, and at most
// 100 faults wait at once. A customer is at most 255 characters, a
// description 1000, an order status 100.
//
// Bodies over 1 MiB get 413. A JSON body nested over 100 levels, or with an
// object whose member names are equal after encoding/json's case folding
// ("amount" and "AMOUNT"), gets 400 bad-request: the handler would
// read only the last of such names, so two orders of one body would be two
// payments under one fingerprint.
//
// The lease is not extended while a payment is processed: [Options.Lease]
// must be longer than [Options.ProcessingDelay], and the constructors panic
// otherwise, as the program refuses -lease no longer than -processing-delay.
package fakeserver
