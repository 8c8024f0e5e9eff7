-- The database alone crediting a provider's deposit webhook: one call of
-- the service's own deposit() per event, with the arguments the server
-- passes (a new event id, its fingerprint, the default limits, tolerance,
-- retention and waits),
-- as one round trip. Every credit debits the provider's one clearing
-- wallet, as the service's do. After setup.sql and clearing_setup.sql.
\set a random(1, :n)
\set k random(1, 140737488355327)
SELECT claim, verdict FROM deposit(
    'pgbench-' || :k,
    sha256(convert_to('event-' || :k, 'UTF8')),
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    1, 'USD', now(), 100000000, 720, 300, 744, 2000, 3000,
    gen_random_uuid(), '4bf92f3577b34da6a3ce929d0e0e4736', 'provider', NULL);
