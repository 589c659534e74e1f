-- The example shop, its owner, the least-privilege role of the connector and the publication.
--
-- Run once by the postgres image's entrypoint (/docker-entrypoint-initdb.d) as the superuser, in
-- the database POSTGRES_DB=shop, when the data volume is empty. The passwords come from the
-- container's environment (psql 15's \getenv), never from this file:
--   CDC_DB_PASSWORD       the connector's role `cdc`
--   REGISTRY_DB_PASSWORD  the schema registry's role `registry` (its storage, database `registry`)
--
-- Who owns what, and why:
--   shop_owner  owns the tables, as an application's migration role would. It also creates and
--               owns the publication: CREATE PUBLICATION ... FOR TABLE needs ownership of every
--               table in it, and that is more than the connector should have.
--   cdc         LOGIN REPLICATION, SELECT on the captured tables, nothing else. It creates the
--               replication slot (REPLICATION is enough) and finds the publication already there
--               with exactly its tables, so it never needs to create or alter one. To capture
--               another table: as shop_owner, ALTER PUBLICATION shop_cdc ADD TABLE ...; GRANT
--               SELECT ON ... TO cdc; then add it to `tables` in cdc.yaml and send SIGHUP.

\set ON_ERROR_STOP on

\getenv cdc_password CDC_DB_PASSWORD
\getenv registry_password REGISTRY_DB_PASSWORD
\if :{?cdc_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'CDC_DB_PASSWORD is not set in the postgres container''s environment'; END $$;
\endif
\if :{?registry_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'REGISTRY_DB_PASSWORD is not set in the postgres container''s environment'; END $$;
\endif

-- The owner of the application's tables: no login, used through SET ROLE here.
CREATE ROLE shop_owner NOLOGIN;
GRANT CREATE ON DATABASE shop TO shop_owner;          -- CREATE PUBLICATION needs it
GRANT USAGE, CREATE ON SCHEMA public TO shop_owner;

SET ROLE shop_owner;

CREATE TABLE customers (
    id          serial PRIMARY KEY,
    name        text NOT NULL,
    email       text UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE products (
    id          serial PRIMARY KEY,
    sku         text NOT NULL UNIQUE,
    title       text NOT NULL,
    price       numeric(10,2) NOT NULL,
    tags        text[] NOT NULL DEFAULT '{}'
);
CREATE TABLE orders (
    id          bigserial PRIMARY KEY,
    customer_id int NOT NULL REFERENCES customers(id),
    status      text NOT NULL DEFAULT 'new',
    placed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_lines (
    order_id    bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
    line_no     int NOT NULL,
    product_id  int NOT NULL REFERENCES products(id),
    quantity    int NOT NULL,
    unit_price  numeric(10,2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);

-- Exactly the tables in deploy/cdc.yaml, under the name in source.publication.
CREATE PUBLICATION shop_cdc FOR TABLE customers, products, orders, order_lines;

INSERT INTO customers (name, email) VALUES
    ('Ada Lovelace', 'ada@example.org'),
    ('Grace Hopper', 'grace@example.org');
INSERT INTO products (sku, title, price, tags) VALUES
    ('KB-01', 'Mechanical keyboard', 89.90, '{hardware,input}'),
    ('BK-03', 'The Art of Computer Programming', 199.00, '{books}');

RESET ROLE;

-- The connector: replication, and reading the captured tables. No ownership, no DDL, no writes.
CREATE ROLE cdc LOGIN REPLICATION PASSWORD :'cdc_password';
GRANT CONNECT ON DATABASE shop TO cdc;
GRANT USAGE ON SCHEMA public TO cdc;
GRANT SELECT ON customers, products, orders, order_lines TO cdc;

-- The schema registry's storage (Apicurio Registry, SQL storage on PostgreSQL).
CREATE ROLE registry LOGIN PASSWORD :'registry_password';
CREATE DATABASE registry OWNER registry;
