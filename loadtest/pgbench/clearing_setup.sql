-- The clearing wallets the entry points move money through, made as the
-- server makes them on start (deposits come from the provider's, payouts
-- are held in the holds wallet and go to the gateway's): so that the
-- database alone can run deposit() and payout() on the table setup.sql
-- made, and a server started on it finds them there.
INSERT INTO users (id, name, name_key, name_skeleton, password_hash)
SELECT ('00000000-0000-0000-0002-' || lpad(to_hex(i), 12, '0'))::uuid, 'pgbench-clearing-' || source,
       'pgbench-clearing-' || source, 'pgbench-clearing-' || source, 'x'
FROM (VALUES (1, 'provider'), (2, 'holds'), (3, 'gateway')) AS clearing (i, source);
INSERT INTO wallets (id, user_id, currency, opening_balance_minor, balance_minor, clearing_source)
SELECT ('00000000-0000-0000-0003-' || lpad(to_hex(i), 12, '0'))::uuid,
       ('00000000-0000-0000-0002-' || lpad(to_hex(i), 12, '0'))::uuid, 'USD', 0, 0, source
FROM (VALUES (1, 'provider'), (2, 'holds'), (3, 'gateway')) AS clearing (i, source);
