-- The idempotency table at size: :keys completed keys spread over the :n
-- users setup.sql made, each with a stored answer the size of a real
-- transfer's receipt, expiring a day from now as the server's do. Their
-- transfers are left out (transfer_id stays empty): the table and its
-- indexes are what a claim has to search and insert into.
INSERT INTO idempotency_keys (user_id, key, fingerprint, response_status, response_body, expires_at, response_trace_id)
SELECT ('00000000-0000-0000-0000-' || lpad(to_hex(1 + i % :n), 12, '0'))::uuid,
       gen_random_uuid(),
       sha256(int8send(i)),
       201,
       '{"transfer_id":"' || gen_random_uuid() || '","from_wallet_id":"00000000-0000-0000-0001-000000000001",'
         || '"to_wallet_id":"00000000-0000-0000-0001-000000000002","amount_minor":1,"currency":"USD",'
         || '"created_at":"2026-12-04T10:00:00.000000Z","balance_after_minor":99999999}',
       now() + interval '1 day' * random(),
       '4bf92f3577b34da6a3ce929d0e0e4736'
FROM generate_series(1, :keys) AS i;
VACUUM ANALYZE idempotency_keys;
-- Written out now, so that the measurements after it do not share the
-- disk with the checkpoint the fill would otherwise cause.
CHECKPOINT;
