"""The engine: the append tree, cursors, redelivery, message IDs and the partition
manager that composes them. Django-free (an import contract keeps it so): the cluster
runtime gives it a store, a lease and a clock."""
