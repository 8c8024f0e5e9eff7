-- One completed key per user for replay_fn.sql: the first call of each is
-- the transfer, every later one a replay.
SELECT count(*) FILTER (WHERE claim = 'started') AS completed
FROM generate_series(1, :n) AS i,
LATERAL transfer(
    ('00000000-0000-0000-0000-' || lpad(to_hex(i), 12, '0'))::uuid,
    sha256(convert_to('pgbench-token-' || i, 'UTF8')),
    ('00000000-0000-4000-9000-' || lpad(to_hex(i), 12, '0'))::uuid,
    sha256(convert_to('replayed-' || i, 'UTF8')),
    24, 2000, 3000,
    gen_random_uuid(),
    ('00000000-0000-0000-0001-' || lpad(to_hex(i), 12, '0'))::uuid,
    ('00000000-0000-0000-0001-' || lpad(to_hex(1 + (i % :n)), 12, '0'))::uuid,
    1, '4bf92f3577b34da6a3ce929d0e0e4736');
