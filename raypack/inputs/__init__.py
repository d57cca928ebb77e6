"""Reading inputs: shards of token lists (Parquet, JSON Lines, Arrow IPC), their counts, and raw texts."""
