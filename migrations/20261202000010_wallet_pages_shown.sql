-- The page a browser form leads to, kept so that the form can redirect to
-- it (post/redirect/get): the review of a typed transfer, or what happened
-- after Send. Reloading that address shows the page again and sends
-- nothing.
--
-- One row per person, replaced by their next form, and gone after
-- wallet_page_retention_s: a reload after that shows the wallet, whose
-- history says what was sent.
CREATE TABLE wallet_pages_shown (
    user_id    uuid        PRIMARY KEY REFERENCES users (id),
    id         uuid        NOT NULL,
    expires_at timestamptz NOT NULL,
    page       jsonb       NOT NULL
);
CREATE INDEX wallet_pages_shown_expiry_idx ON wallet_pages_shown (expires_at);
