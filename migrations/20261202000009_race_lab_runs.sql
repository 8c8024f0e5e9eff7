-- When each visitor's race-lab runs started, for the per-visitor spacing
-- and per-minute quota (race_lab_run_spacing_ms,
-- race_lab_runs_per_user_per_minute_max). A run records its start while it
-- holds the visitor's run lease (an advisory lock), so two instances cannot
-- both let a run through; rows older than a minute are deleted by the next
-- run of the same visitor, so each visitor holds at most the quota's rows.
CREATE TABLE race_lab_runs (
    user_id    uuid        NOT NULL REFERENCES users (id),
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX race_lab_runs_user_idx ON race_lab_runs (user_id, started_at);
