"""The PostgreSQL stores: calls of the SQL functions, rows, runners, LISTEN."""
