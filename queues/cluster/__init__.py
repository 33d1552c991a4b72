"""The cluster runtime of a node: its processes' partitions and leases, the router that
forwards calls to a partition's owner, balance, peer authentication, the server, and
the housekeeping that purges and deduplicates."""
