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

-- The algorithm each record's fingerprint was made with. 0 is a record
-- written by code from before versions (method, path and body: version 1's
-- algorithm), which never names the column; this code always writes 1 or 2.
ALTER TABLE idempotency_records
    ADD COLUMN fingerprint_version smallint NOT NULL DEFAULT 0;

-- A process of the earlier version still running after this migration
-- writes its caller in clear, with fingerprint_version 0: the trigger
-- stores the digest instead, so that the record is found by every process
-- of this version (and the earlier process, which looks it up in clear,
-- answers 409 or 500 rather than doing the work twice).
CREATE FUNCTION idempotency_records_digest_caller() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.fingerprint_version = 0 THEN
        NEW.caller := encode(sha256(convert_to('idem.principal.v1:' || NEW.caller, 'UTF8')), 'hex');
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER idempotency_records_digest_caller
    BEFORE INSERT ON idempotency_records
    FOR EACH ROW EXECUTE FUNCTION idempotency_records_digest_caller();
