"""Local stand-ins for the external services the digest talks to, driven over real sockets."""
