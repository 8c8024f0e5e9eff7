-- Accounts and their bearer tokens.
--
-- A name is stored three ways. `name` is exactly what was typed, and unique.
-- `name_key` (NFKC and case folding) is what look-ups and sign-ins match;
-- `name_skeleton` (the UTS #39 confusable skeleton of name_key) refuses a
-- name that reads like an existing one. Both are computed by the service
-- (backend/src/names.rs) and unique, so two sign-ups racing for look-alike
-- names cannot both win. They are nullable: an account whose computed
-- forms collide with an older account's keeps working under its exact name,
-- and the service's start-up backfill leaves it NULL.
CREATE TABLE users (
    id            uuid        PRIMARY KEY,
    name          text        NOT NULL UNIQUE
                              CHECK (char_length(name) BETWEEN 1 AND 64),
    password_hash text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    name_key      text,
    name_skeleton text
);
CREATE UNIQUE INDEX users_name_key_idx ON users (name_key);
CREATE UNIQUE INDEX users_name_skeleton_idx ON users (name_skeleton);

-- Bearer tokens are stored only as the SHA-256 of the token string; the
-- token itself is shown once, at issue, and never again. Revoking a token
-- deletes its row.
CREATE TABLE api_tokens (
    token_hash bytea       PRIMARY KEY CHECK (octet_length(token_hash) = 32),
    user_id    uuid        NOT NULL REFERENCES users (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX api_tokens_expires_at_idx ON api_tokens (expires_at);

-- Token liveness, in one definition: the token's hash is stored (not
-- revoked), for this user, and not expired. The authentication of reads
-- (auth::token_is_live), the statement-by-statement transfer path and
-- transfer() all ask this function. PL/pgSQL, as every function on the
-- transfer's path whose body PostgreSQL cannot inline: it keeps its plan
-- for the session (migrations/README.md says why).
CREATE FUNCTION token_is_live(p_token_hash bytea, p_user uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM api_tokens t
        WHERE t.token_hash = p_token_hash AND t.user_id = p_user AND t.expires_at > now());
END
$$;
