"""The order in which gangs are tried, their backoff, and reservations."""
