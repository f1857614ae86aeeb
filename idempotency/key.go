package idempotency

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on an answer replayed from a stored record.
// A fresh answer never carries it.
const HeaderReplayed = "Idempotent-Replayed"
