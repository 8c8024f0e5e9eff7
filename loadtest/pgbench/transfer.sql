-- The service's transfer transaction as a plain sequence of statements:
-- claim the key, guarded debit, credit, transfer and ledger rows, store the
-- response. One round trip per statement, as a straightforward service
-- would make them. :n wallets; :hot = 1 makes every transfer pay wallet 1.
\set a random(1 + :hot, :n)
\set b 1 + (:a % :n) * (1 - :hot)
\set k random(1, 140737488355327)
BEGIN;
INSERT INTO idempotency_keys (user_id, key, fingerprint, expires_at)
VALUES (('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
        ('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:k AS bigint)), 12, '0'))::uuid,
        sha256(CAST(CAST(:k AS text) AS bytea)), now() + interval '24 hours')
ON CONFLICT DO NOTHING;
UPDATE wallets SET balance_minor = balance_minor - 1
WHERE id = ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid AND balance_minor >= 1;
UPDATE wallets SET balance_minor = balance_minor + 1
WHERE id = ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:b AS bigint)), 12, '0'))::uuid;
WITH t AS (
    INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by, idempotency_key)
    VALUES (gen_random_uuid(),
            ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
            ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:b AS bigint)), 12, '0'))::uuid, 1,
            ('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
            ('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:k AS bigint)), 12, '0'))::uuid)
    RETURNING id, from_wallet_id, to_wallet_id)
INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
SELECT id, from_wallet_id, -1 FROM t UNION ALL SELECT id, to_wallet_id, 1 FROM t;
UPDATE idempotency_keys SET response_status = 201, response_body = '{}'
WHERE user_id = ('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid
  AND key = ('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:k AS bigint)), 12, '0'))::uuid;
COMMIT;
