"""What the store holds: keys, records, the value codec, run states."""
