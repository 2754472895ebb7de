"""The store's schema: its SQL files, loading them, migrating with alembic."""
