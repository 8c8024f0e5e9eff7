-- Wallets for the pgbench ceiling: :n users, each with a wallet, ids
-- derived from the integer so the transfer script can name them.
TRUNCATE ledger_entries, idempotency_keys, transfers, api_tokens, wallets, users CASCADE;
-- Each with its lookup key and a skeleton, as every account made since
-- names have keys carries, so that a server starting on this table has no
-- keys to fill in (one UPDATE per user: 40 s for 10^5 users). Plain ASCII
-- names, so the key is the lower-case name; the skeleton is set to the key,
-- which keeps it unique: these names are never compared for look-alikes.
INSERT INTO users (id, name, name_key, name_skeleton, password_hash)
SELECT ('00000000-0000-0000-0000-' || lpad(to_hex(i), 12, '0'))::uuid, 'pgbench-' || i,
       'pgbench-' || i, 'pgbench-' || i, 'x'
FROM generate_series(1, :n) AS i;
INSERT INTO wallets (id, user_id, currency, opening_balance_minor, balance_minor)
SELECT ('00000000-0000-0000-0001-' || lpad(to_hex(i), 12, '0'))::uuid,
       ('00000000-0000-0000-0000-' || lpad(to_hex(i), 12, '0'))::uuid, 'USD', 100000000, 100000000
FROM generate_series(1, :n) AS i;
-- One live token per user, hashed as the server hashes its tokens (any 32
-- bytes will do for the database): transfer() checks it like the server's.
INSERT INTO api_tokens (token_hash, user_id, expires_at)
SELECT sha256(convert_to('pgbench-token-' || i, 'UTF8')),
       ('00000000-0000-0000-0000-' || lpad(to_hex(i), 12, '0'))::uuid, now() + interval '1 day'
FROM generate_series(1, :n) AS i;
-- Fresh statistics, so that the planner knows the tables' sizes at once.
ANALYZE users, wallets, api_tokens;
