"""The dashboards' Spark pipeline.

``transforms`` holds pure DataFrame-to-DataFrame functions (no I/O, no Django), so each is
tested on a few hand-made rows; ``job`` is the thin part that builds the session, reads the
attempt log, calls the transforms and writes the results back through Django.
"""
