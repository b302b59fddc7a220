"""The auth room: the home's credentials, event signatures, S3 request signatures and PostgreSQL's roles
and authentication."""
