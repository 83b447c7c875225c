"""Alembic migrations of the SQL event store (`streams.store`).

A package so that an installed Rollstream carries them: `streams.store.migrate`
points alembic's `script_location` at this directory. Create a new revision with
`alembic -c migrations/alembic.ini revision --autogenerate -m "..."`.
"""
