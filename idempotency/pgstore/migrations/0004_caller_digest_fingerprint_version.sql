-- Callers are kept as digests, never in clear: a principal may be a
-- credential (a bearer token), and a long one broke the primary key's
-- btree limit. Existing rows get the digest the code computes
-- (idempotency.PrincipalDigest): lower-case hex SHA-256 of
-- 'idem.principal.v1:' || principal, with sha256() from PostgreSQL's core
-- (11 and later; no extension needed).
UPDATE idempotency_records
SET caller = encode(sha256(convert_to('idem.principal.v1:' || caller, 'UTF8')), 'hex');

COMMENT ON COLUMN idempotency_records.caller IS
    'hex SHA-256 of ''idem.principal.v1:'' || principal; never the principal itself';

-- The algorithm each record's fingerprint was made with: version 1 (method,
-- path, body) for the records made before the query string counted, so
-- that their retries keep matching; new records are version 2.
ALTER TABLE idempotency_records
    ADD COLUMN fingerprint_version smallint NOT NULL DEFAULT 1;
