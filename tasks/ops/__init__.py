"""What operators use: the ``digest`` command, the console, and the actions both offer."""
