"""Where the service uses a dependency's private names, each dependency in one module.

A private name (a leading underscore, a module of the package's own internals) is not covered
by the package's compatibility promise: any release may rename it. Each module here gathers
every such use of one package, says in its docstring which names it uses and against which
pinned version (``requirements.txt``) they were checked, and ``tests/unit/test_glue.py`` fails
if one of them disappears or changes shape, so an upgrade is caught by the unit suite.
Nothing else in the project imports a private name of these packages.
"""
