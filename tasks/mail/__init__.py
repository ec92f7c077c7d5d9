"""The email transports: the message and its receipt, SMTP and the file outbox, Resend's API."""
