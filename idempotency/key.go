package idempotency

// headerKey is the request header that carries the idempotency key; the
// middleware echoes it on every answer to a keyed request.
const headerKey = "Idempotency-Key"

// headerReplayed is set to "true" on an answer replayed from a stored
// record. A fresh answer never carries it.
const headerReplayed = "Idempotent-Replayed"
