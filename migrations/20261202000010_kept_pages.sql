-- Pages a browser form leads to, kept so that the form can redirect to
-- them (post/redirect/get): reloading such an address shows the same page
-- and never does the form's work again.
--
-- - 'race_lab_run': a race-lab run's results at /race-lab/runs/{id}, which
--   anyone with the address may read;
-- - 'wallet': the review of a typed transfer, or what happened after Send,
--   which only its owner may read.
--
-- Bounded twice: each row expires (race_lab_result_retention_hours,
-- wallet_page_retention_s; the sweeper deletes it and a read ignores it from
-- then on), and each person keeps at most a number per kind
-- (race_lab_results_per_user_max; one wallet page), the oldest pushed out
-- when a new one is kept.
CREATE TABLE kept_pages (
    id         uuid        PRIMARY KEY,
    user_id    uuid        NOT NULL REFERENCES users (id),
    kind       text        NOT NULL CHECK (kind IN ('race_lab_run', 'wallet')),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,
    page       jsonb       NOT NULL
);
CREATE INDEX kept_pages_owner_idx ON kept_pages (user_id, kind, created_at DESC);
CREATE INDEX kept_pages_expiry_idx ON kept_pages (expires_at);
