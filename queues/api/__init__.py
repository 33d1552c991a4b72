"""The DRF API: thin views over ``queues.service``."""
