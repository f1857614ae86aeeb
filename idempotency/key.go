package idempotency

// headerKey is the request header that carries the idempotency key; the
// middleware echoes it on every answer to a keyed request.
const headerKey = "Idempotency-Key"

// headerReplayed is set to "true" on an answer replayed from a stored
// record. A fresh answer never carries it.
const headerReplayed = "Idempotent-Replayed"

// headerBodyOmitted is set on a replay whose record kept no body, to say
// why: "too-large" (over Config.MaxStoredBodyBytes) or "confidential"
// (Config.Confidential). The status, Location and Content-Type are the
// stored ones; the body is empty. A fresh answer never carries it.
const headerBodyOmitted = "Idempotent-Body-Omitted"
