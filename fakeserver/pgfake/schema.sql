-- The fake server's business tables, beside pgstore's idempotency_records.
CREATE TABLE IF NOT EXISTS fake_payments (
    seq         bigserial   NOT NULL UNIQUE, -- creation order, for listing
    id          text        PRIMARY KEY,
    principal   text        NOT NULL, -- idempotency.PrincipalDigest of the caller
    idem_key    text        NOT NULL, -- '' when made without a key
    amount      bigint      NOT NULL,
    currency    text        NOT NULL,
    customer    text        NOT NULL,
    description text        NOT NULL,
    status      text        NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fake_payments_by_key ON fake_payments (principal, idem_key);

-- Intents to charge: one row per payment id (the server's stable id, the
-- provider's idempotency key), written before the provider is asked and
-- kept, so that any process can tell what a dead worker may have charged,
-- under which key, long after its record is gone.
CREATE TABLE IF NOT EXISTS fake_intents (
    seq         bigserial   NOT NULL UNIQUE, -- creation order: a key's latest intent
    id          text        PRIMARY KEY,
    principal   text        NOT NULL,
    idem_key    text        NOT NULL,
    description text        NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fake_intents_by_key ON fake_intents (principal, idem_key, seq);

-- The fake provider's charges, idempotent on the server's stable id.
CREATE TABLE IF NOT EXISTS fake_charges (
    id         text        PRIMARY KEY,
    amount     bigint      NOT NULL,
    currency   text        NOT NULL,
    customer   text        NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS fake_orders (
    principal text NOT NULL,
    id        text NOT NULL,
    status    text NOT NULL,
    PRIMARY KEY (principal, id)
);

-- Counters shared by every process: executions, requests.
CREATE TABLE IF NOT EXISTS fake_counters (
    name text   PRIMARY KEY,
    n    bigint NOT NULL
);
