-- The two roles of a deployment, and what each may do. Run by a superuser
-- (or a role with CREATEROLE that may change the database), with psql:
--
--   psql "$SERVER_URL" -v database=layered_wallet \
--        -v owner_role=layered_wallet_owner -v owner_password=... \
--        -v app_role=layered_wallet_app -v app_password=... \
--        -f deploy/postgres/roles.sql
--
-- The owner owns the database, the schema and everything in it: the
-- migrations run as the owner. The app role is what the server connects
-- as: it may read and write the rows of the tables and call the
-- functions, and nothing else: no DDL, no TRUNCATE, no superuser, no
-- role creation. Safe to run again.
\set ON_ERROR_STOP on

SELECT format('CREATE ROLE %I LOGIN', :'owner_role')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'owner_role') \gexec
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE', :'app_role')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app_role') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'owner_role', :'owner_password') WHERE :'owner_password' <> '' \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'app_role', :'app_password') WHERE :'app_password' <> '' \gexec

SELECT format('ALTER DATABASE %I OWNER TO %I', :'database', :'owner_role') \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', :'database') \gexec
SELECT format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %I', :'database', :'app_role') \gexec

\connect :database
SELECT format('ALTER SCHEMA public OWNER TO %I', :'owner_role') \gexec
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
SELECT format('GRANT USAGE ON SCHEMA public TO %I', :'app_role') \gexec

-- What the migrations create from now on.
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public
                   GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', :'owner_role', :'app_role') \gexec
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public
                   GRANT USAGE, SELECT ON SEQUENCES TO %I', :'owner_role', :'app_role') \gexec
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public
                   GRANT EXECUTE ON FUNCTIONS TO %I', :'owner_role', :'app_role') \gexec

-- What a database migrated before the split already holds: handed to the
-- owner, and granted as above.
SELECT format('ALTER TABLE public.%I OWNER TO %I', tablename, :'owner_role')
FROM pg_tables WHERE schemaname = 'public' AND tableowner <> :'owner_role' \gexec
SELECT format('ALTER SEQUENCE public.%I OWNER TO %I', sequencename, :'owner_role')
FROM pg_sequences WHERE schemaname = 'public' AND sequenceowner <> :'owner_role' \gexec
SELECT format('ALTER ROUTINE %s OWNER TO %I', p.oid::regprocedure, :'owner_role')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> :'owner_role' \gexec
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO %I', :'app_role') \gexec
SELECT format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO %I', :'app_role') \gexec
SELECT format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO %I', :'app_role') \gexec
