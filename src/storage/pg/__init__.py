"""The PostgreSQL backend of the storage port (docs/storage.md, "PostgreSQL"). Importing this package
does not import asyncpg; ``storage.pg.store`` does."""
