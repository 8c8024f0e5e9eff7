-- The database alone deciding :batch transfers in one call of the
-- service's transfer_batch(), with the arguments the server passes (live
-- tokens, fresh idempotency keys, the default waits): one round trip per
-- batch. :n wallets; each transfer pays from a random wallet to another
-- random one (crossing transfers included); :hot = 1 makes every transfer
-- pay wallet 1. The arithmetic is in bigint: in int, a seed near the top
-- of its range overflowed once every few runs and aborted the client.
\set seed random(1, 2147483647)
\set span :n - :hot
SELECT count(*) AS answers FROM (
  WITH t AS (
    SELECT i,
           1 + (abs(CAST(hashint8(CAST(:seed AS bigint) + i) AS bigint)) % CAST(:span AS int)) + CAST(:hot AS int) AS a,
           CASE WHEN CAST(:hot AS int) = 1 THEN 1 ELSE 1 + (abs(CAST(hashint8(CAST(:seed AS bigint) + 7919 * i) AS bigint)) % CAST(:n AS int)) END AS b
      FROM generate_series(1, CAST(:batch AS int)) AS i
  ), named AS (
    SELECT i, ('00000000-0000-0000-0000-' || lpad(to_hex(a), 12, '0'))::uuid AS u,
           ('00000000-0000-0000-0001-' || lpad(to_hex(a), 12, '0'))::uuid AS f,
           ('00000000-0000-0000-0001-' || lpad(to_hex(CASE WHEN b = a THEN 1 + a % CAST(:n AS int) ELSE b END), 12, '0'))::uuid AS t,
           sha256(convert_to('pgbench-token-' || a, 'UTF8')) AS h,
           gen_random_uuid() AS k
      FROM t
  )
  SELECT * FROM transfer_batch(
      (SELECT array_agg(u ORDER BY i) FROM named),
      (SELECT array_agg(h ORDER BY i) FROM named),
      (SELECT array_agg(k ORDER BY i) FROM named),
      (SELECT array_agg(sha256(convert_to('fingerprint-' || k, 'UTF8')) ORDER BY i) FROM named),
      (SELECT array_agg(gen_random_uuid() ORDER BY i) FROM named),
      (SELECT array_agg(f ORDER BY i) FROM named),
      (SELECT array_agg(t ORDER BY i) FROM named),
      (SELECT array_fill(1::bigint, ARRAY[CAST(:batch AS int)])),
      (SELECT array_fill('4bf92f3577b34da6a3ce929d0e0e4736'::text, ARRAY[CAST(:batch AS int)])),
      24, 2000, 3000)
) AS answers;
