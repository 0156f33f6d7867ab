"""dcco's version, in a module of its own so that any layer can read it without importing the
package's top (``dcco.__init__``, which sits above every other module)."""

__version__ = "0.1.0"
"""The release, as ``pyproject.toml``'s ``project.version`` gives it (a test keeps the two
equal)."""
