"""What speaks to Redis: every command and script, its errors translated once."""
