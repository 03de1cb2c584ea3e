"""Service Broker's T-SQL DDL and the catalog: `kbroker import-sql` reads a database's CREATE
MESSAGE TYPE, CONTRACT, QUEUE, SERVICE, ROUTE, BROKER PRIORITY and REMOTE SERVICE BINDING
statements, and its DROPs (grammar.py, parse.py), into catalog definitions (to_catalog.py,
options.py, priority_drops.py, remote_bindings.py), and to_tsql.py writes a catalog back as such
statements. Pure: text in, definitions, notes and errors out."""
