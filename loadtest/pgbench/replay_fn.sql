-- The database alone answering a retry: transfer() with a key each user
-- already completed (replay_setup.sql), so every call is a replay.
\set a random(1, :n)
\set b 1 + (:a % :n)
SELECT refused, claim FROM transfer(
    ('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    sha256(convert_to('pgbench-token-' || :a, 'UTF8')),
    ('00000000-0000-4000-9000-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    sha256(convert_to('replayed-' || :a, 'UTF8')),
    24, 2000, 3000,
    gen_random_uuid(),
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:b AS bigint)), 12, '0'))::uuid,
    1, '4bf92f3577b34da6a3ce929d0e0e4736');
