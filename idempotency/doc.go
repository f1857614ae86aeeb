// Package idempotency is the server side of the Idempotency-Key contract.
// It is net/http middleware over a small record store. The fake server of
// [github.com/idemkit/idem/fakeserver] is built on it. A production server
// uses it with a store over its own database, such as
// [github.com/idemkit/idem/idempotency/pgstore].
//
// [New] wraps the handler of an endpoint that requires a key. A retry with
// the same key and the same request gets the stored answer, byte for byte.
// A key reused for another request gets 422. A key whose work still runs
// gets 409 with Retry-After. Every answer carries the key back in
// Idempotency-Key. That is the server's mark, which clients trust.
//
// Keys are scoped to the account the request acts for.
// [Config.Principal] returns it, and it has no default. A store keeps only
// its [PrincipalDigest], never the principal.
//
// The handler does not change business state directly. It registers its
// effect with [OnCommit]. The effect then commits with the COMPLETED
// record, or not at all. A server error (500 or above) drops the effect
// and stores no answer. The retry then does the work. A handler that did
// nothing outside the store says so with [NothingDone]. Then a server
// error frees the key.
//
// Work outside the store, such as a payment provider, cannot join the
// commit. The handler passes [Info.StableID] to the provider as its
// idempotency key. After a crash, the next request takes the record over
// with [Info.Takeover] set. It must ask the provider what was done first.
//
// There are two modes. In the default lease mode, the record is committed
// IN_PROGRESS before the handler runs. A crashed worker's record is taken
// over when its lease ([Config.Lease]) ends. [Config.OneTransaction] runs
// the whole request in one transaction of a [TxStore] instead. It suits
// handlers whose every effect is a write to the store's database.
//
// Leases and retention are judged on the store's clock, never the host's.
// A store error answers 500 with nothing internal in it. A store wait past
// its bound answers 503.
//
// docs/SERVER.md, "How the middleware decides", gives every check, its
// answer, and the fingerprint's rules.
package idempotency
