-- +goose Up
-- The schema of idem's first release: the idempotency records and the
-- inbox of processed messages. A semicolon ends a line (outside comments)
-- only where a statement ends: goose splits a file at such lines, while
-- pgstore.Migrate and golang-migrate send it whole, and all three must run
-- the same statements.

-- The idempotency records: one row per (caller, key).
CREATE TABLE idempotency_records (
    caller              text        NOT NULL, -- idempotency.PrincipalDigest of the principal, never the principal
    key                 text        NOT NULL, -- the Idempotency-Key, unquoted
    fingerprint         bytea       NOT NULL, -- SHA-256 of what the request means
    fingerprint_version smallint    NOT NULL, -- the algorithm of the fingerprint
    status              text        NOT NULL CHECK (status IN ('IN_PROGRESS', 'COMPLETED')),
    stable_id           text        NOT NULL, -- the server's own id, given to providers
    owner               text        NOT NULL DEFAULT '', -- lease token of the worker; '' when none
    locked_until        timestamptz,          -- end of the owner's lease
    created_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL, -- created_at + retention; absent from then on
    response_status     integer,              -- the stored answer of a COMPLETED record
    response_header     jsonb,
    response_body       bytea,
    PRIMARY KEY (caller, key)
);

COMMENT ON COLUMN idempotency_records.caller IS
    'hex SHA-256 of ''idem.principal.v1:'' || principal, never the principal itself';

-- The sweep deletes by expiry, oldest first, walking this index.
CREATE INDEX idempotency_records_expires_at ON idempotency_records (expires_at);

-- Messages a consumer has processed: one row per (consumer, message id),
-- written in the transaction of the message's effect.
CREATE TABLE idempotency_inbox (
    consumer     text        NOT NULL, -- the consumer (a queue or subscription name)
    message_id   text        NOT NULL, -- the id the producer gave the message
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- The inbox's sweep deletes by age, oldest first, walking this index.
CREATE INDEX idempotency_inbox_processed_at ON idempotency_inbox (processed_at);
