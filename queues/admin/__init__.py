"""The operators' console for the messaging core: queues, partitions and nodes.

Every figure is read from live state: the partition rows, which each owner refreshes at every
heartbeat (depth, in flight, delayed, rates, the append tree's shape), and the key-value store
for the tree drawing. The actions (purge, redrive, release a lease) call the same service
functions as the API, so they route to the owners like any client call.

One module per model admin; importing them registers them."""

from queues.admin import audit, grants, nodes, partitions, queues, subscriptions, tokens  # noqa: F401
