-- A race-lab run's results, kept so that they have an address of their own
-- (/race-lab/runs/{id}): reloading that page shows the same run and never
-- fires again, and the address can be shared. The row holds the page's view
-- of the run as JSON, drawn once from the database right after the run.
--
-- Bounded twice: each row expires after race_lab_result_retention_hours
-- (the sweeper deletes it; a read ignores it from then on), and a visitor
-- keeps at most race_lab_results_per_user_max rows, the oldest pushed out
-- when a new run is stored.
CREATE TABLE race_lab_results (
    id         uuid        PRIMARY KEY,
    user_id    uuid        NOT NULL REFERENCES users (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    view       jsonb       NOT NULL
);
CREATE INDEX race_lab_results_user_idx ON race_lab_results (user_id, created_at DESC);
CREATE INDEX race_lab_results_expiry_idx ON race_lab_results (expires_at);
