-- The database alone applying a broker's transfer commands a batch at a
-- time, as the service's consumers do: one call of the service's own
-- broker_command_batch() per batch of :batch commands (the service's
-- default commands_read_batch_entries_max is 16), each with the arguments
-- a consumer passes (a new command id, its fingerprint, the default age
-- limit, future tolerance, retention and waits), as one round trip. Each
-- transaction is one batch: commands/s is the tps times :batch. Compare at
-- as many clients as there are partitions. After setup.sql.
\set a random(1, :n)
\set k random(1, 140737488355327)
SELECT count(*) FILTER (WHERE verdict = 'applied') FROM broker_command_batch(
    ARRAY(SELECT 'pgbench-' || :k || '-' || i FROM generate_series(1, CAST(:batch AS int)) AS i),
    ARRAY(SELECT sha256(convert_to('command-' || :k || '-' || i, 'UTF8')) FROM generate_series(1, CAST(:batch AS int)) AS i),
    array_fill('bench'::text, ARRAY[CAST(:batch AS int)]),
    ARRAY(SELECT ('00000000-0000-0000-0001-' || lpad(to_hex(1 + (CAST(:a AS int) + i * 7919) % CAST(:n AS int)), 12, '0'))::uuid
            FROM generate_series(1, CAST(:batch AS int)) AS i),
    ARRAY(SELECT ('00000000-0000-0000-0001-' || lpad(to_hex(1 + (CAST(:a AS int) + i * 7919 + 1) % CAST(:n AS int)), 12, '0'))::uuid
            FROM generate_series(1, CAST(:batch AS int)) AS i),
    array_fill(1::bigint, ARRAY[CAST(:batch AS int)]),
    array_fill(now(), ARRAY[CAST(:batch AS int)]),
    array_fill(NULL::text, ARRAY[CAST(:batch AS int)]),
    ARRAY(SELECT gen_random_uuid() FROM generate_series(1, CAST(:batch AS int)) AS i),
    720, 300, 744, 2000, 3000);
