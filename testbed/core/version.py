"""The testbed's version (one place; ``testbed.__version__`` is this)."""

__version__ = "0.1.0"
