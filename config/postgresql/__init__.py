"""Django's PostgreSQL backend with a client-side deadline on every database call (``base``)."""
