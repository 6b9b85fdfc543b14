"""The Users' chat page: static assets shipped in the package, served by the Public server."""
