"""The one error type for input a user can fix.

Raised with a message that names the file, the row and the value, and says what to do.
The CLI prints it as one line on stderr and exits with code 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: a path, a shard, a token, a config value. The message names it."""
