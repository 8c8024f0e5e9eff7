-- The database alone doing exactly the service's work: one call of the
-- service's own transfer() per transfer, with the arguments the server
-- passes (a live token, a fresh idempotency key, the default waits), as
-- one round trip. :n wallets; :hot = 1 makes every transfer pay wallet 1.
\set a random(1 + :hot, :n)
\set b 1 + (:a % :n) * (1 - :hot)
\set k random(1, 140737488355327)
SELECT refused, claim, guard FROM transfer(
    ('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    sha256(convert_to('pgbench-token-' || :a, 'UTF8')),
    ('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:k AS bigint)), 12, '0'))::uuid,
    sha256(convert_to('fingerprint-' || :k, 'UTF8')),
    24, 2000, 3000,
    gen_random_uuid(),
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:b AS bigint)), 12, '0'))::uuid,
    1, '4bf92f3577b34da6a3ce929d0e0e4736');
