-- The database alone accepting a payout: one call of the service's own
-- payout() per request, with the arguments the server passes (a live
-- token, a fresh idempotency key, the default waits, a trace to continue),
-- as one round trip: the hold, the payout row and its outbox row. Every
-- hold credits the one holds wallet, as the service's do. After setup.sql
-- and clearing_setup.sql.
\set a random(1, :n)
\set k random(1, 140737488355327)
SELECT refused, claim, guard FROM payout(
    ('00000000-0000-0000-0000-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    sha256(convert_to('pgbench-token-' || :a, 'UTF8')),
    ('00000000-0000-4000-8000-' || lpad(to_hex(CAST(:k AS bigint)), 12, '0'))::uuid,
    sha256(convert_to('fingerprint-' || :k, 'UTF8')),
    24, 2000, 3000,
    gen_random_uuid(), gen_random_uuid(),
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    1, 'bench-' || :a, '4bf92f3577b34da6a3ce929d0e0e4736',
    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', false);
