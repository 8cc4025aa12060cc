"""The configuration error type, in a module that imports nothing else of the package."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value was refused; the message says which key and why.

    ``testbed`` prints it as one ``testbed: error: ...`` line and exits with code 2.
    """
