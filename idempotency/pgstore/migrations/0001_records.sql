-- The idempotency records: one row per (caller, key).
CREATE TABLE idempotency_records (
    caller          text        NOT NULL, -- the principal that owns the key
    key             text        NOT NULL, -- the Idempotency-Key, unquoted
    fingerprint     bytea       NOT NULL, -- SHA-256 of method, path and body
    status          text        NOT NULL CHECK (status IN ('IN_PROGRESS', 'COMPLETED')),
    stable_id       text        NOT NULL, -- the server's own id, given to providers
    owner           text        NOT NULL DEFAULT '', -- lease token of the worker; '' when none
    locked_until    timestamptz,          -- end of the owner's lease
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL, -- created_at + retention; absent from then on
    response_status integer,              -- the stored answer of a COMPLETED record
    response_header jsonb,
    response_body   bytea,
    PRIMARY KEY (caller, key)
);

-- The sweep deletes by expiry.
CREATE INDEX idempotency_records_expires_at ON idempotency_records (expires_at);
