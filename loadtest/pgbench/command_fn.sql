-- The database alone applying a broker's transfer command: one call of the
-- service's own broker_command() per command, with the arguments a
-- consumer passes (a new command id, its fingerprint, the default age
-- limit, future tolerance, retention and waits), as one round trip. The service's consumers apply
-- one command per partition at a time, so compare at as many clients as
-- there are partitions. After setup.sql.
\set a random(1, :n)
\set b 1 + (:a % :n)
\set k random(1, 140737488355327)
SELECT claim, verdict FROM broker_command(
    'pgbench-' || :k,
    sha256(convert_to('command-' || :k, 'UTF8')),
    'bench',
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:a AS bigint)), 12, '0'))::uuid,
    ('00000000-0000-0000-0001-' || lpad(to_hex(CAST(:b AS bigint)), 12, '0'))::uuid,
    1, now(), NULL, 720, 300, 744, 2000, 3000, gen_random_uuid());
