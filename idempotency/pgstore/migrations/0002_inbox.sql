-- Messages a consumer has processed: one row per (consumer, message id),
-- written in the transaction of the message's effect.
CREATE TABLE idempotency_inbox (
    consumer     text        NOT NULL, -- the consumer (a queue or subscription name)
    message_id   text        NOT NULL, -- the id the producer gave the message
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- The sweep deletes by age.
CREATE INDEX idempotency_inbox_processed_at ON idempotency_inbox (processed_at);
