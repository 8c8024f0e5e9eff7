-- Look-alike names. `bob`, `BOB` and `bob` followed by a zero-width space
-- were three accounts, and money can be sent by name. Two columns, both
-- computed by the service (backend/src/names.rs) and both unique:
--   name_key       NFKC + case folding: what lookups and sign-ins match on;
--   name_skeleton  the UTS #39 confusable skeleton of name_key: a name that
--                  reads like an existing one is refused.
-- Existing rows start with NULLs (NULLs never conflict), so this migration
-- cannot fail on existing data; the service fills them in as it starts,
-- oldest account first, and leaves NULL only on a later account that
-- collides with an older one. Such an account keeps working under its exact
-- name, which stays unique.
ALTER TABLE users
    ADD COLUMN name_key text,
    ADD COLUMN name_skeleton text;
CREATE UNIQUE INDEX users_name_key_idx ON users (name_key);
CREATE UNIQUE INDEX users_name_skeleton_idx ON users (name_skeleton);
