-- The database alone doing the dispatcher's work on a backlog: take up to
-- :batch due outbox rows under a lease (payout_take()), then settle them
-- together as the gateway's "sent" would (payout_settle_all()), each its
-- own transaction, as the service does. This leaves the gateway out. After
-- payout_fn.sql has filled the outbox, with as many runs as batches it
-- holds.
SELECT coalesce(array_agg(payout_id), '{}') AS taken FROM payout_take(:batch, 30000) \gset
SELECT count(*) AS settled
  FROM payout_settle_all(:taken::uuid[],
                         ARRAY(SELECT gen_random_uuid() FROM unnest(:taken::uuid[])),
                         ARRAY(SELECT 'bench-' || id FROM unnest(:taken::uuid[]) AS id));
