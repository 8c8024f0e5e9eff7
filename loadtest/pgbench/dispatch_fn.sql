-- The database alone doing the dispatcher's work on a backlog: take up to
-- :batch due outbox rows under a lease (payout_take()), then settle each
-- as the gateway's "sent" would (payout_settle()), as one round trip.
-- The service takes a batch, calls the gateway for each row at once and
-- settles each on its own; this leaves the gateway out. After
-- payout_fn.sql has filled the outbox, with as many transactions as
-- batches it holds.
SELECT count(s.recorded) AS settled
  FROM payout_take(:batch, 30000) AS t,
       LATERAL payout_settle(t.payout_id, gen_random_uuid(), 'bench-' || t.payout_id) AS s;
