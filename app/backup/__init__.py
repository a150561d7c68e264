"""`kvscope backup` and `kvscope restore`: consistent copies of a running SQLite store."""
