"""Each area's SQL, one module per area, on the store's infrastructure (``store``).

The area's service (``messages.service``, ``decisions.service`` ...) is what
the floors above call; a query module may use another (a Decision's insert
grows the tree and writes its webhook deliveries in the same statement), the
store's infrastructure and the neutral leaves, and nothing above the store.
"""
