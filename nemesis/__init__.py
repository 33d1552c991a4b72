"""The nemesis run's history, its checker and its report (docs/explanation/nemesis.md).

A run records every client operation, every node's change of partition ownership and every
fault into one history (``history``); the checker reads the whole history afterwards and says
what broke (``checker``); the report sums it up in JSON and one picture (``report``,
``picture``). This package is a client of the service, as a user's application is: it imports
nothing of the service's packages, and none of them imports it.
"""
