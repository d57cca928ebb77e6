"""The one error type for input a user can fix.

Raised with a message that names the file, the row and the value, and says what to do.
The CLI prints it as one line on stderr and exits with code 2.
"""

from __future__ import annotations

import shlex
from pathlib import Path


class InputError(ValueError):
    """Bad input: a path, a shard, a token, a config value. The message names it."""


class InputChanged(InputError):
    """An input file changed while the run read it: not bad data, so the tasks finished from the other files
    are kept for ``--resume`` (raypack.pack.publish.run_published), where bad input leaves nothing."""


_CHANGED = "input-changed:"


def worker_error_text(error: InputError) -> str:
    """``error`` as the text a Ray worker hands back (its kind kept: :func:`worker_error_from_text`)."""
    return (_CHANGED if isinstance(error, InputChanged) else "") + str(error)


def worker_error_from_text(text: str) -> InputError:
    """The :class:`InputError` (or :class:`InputChanged`) that :func:`worker_error_text` made ``text`` of."""
    return InputChanged(text[len(_CHANGED):]) if text.startswith(_CHANGED) else InputError(text)


class NotAnOutput(InputError):
    """Where an output was to be read, something else: an input directory, a tokenized corpus, nothing; or
    nothing that can be reached (a missing bucket, an endpoint that does not answer, credentials refused).
    The message names what it is. ``raypack verify`` says it as bad input (exit 2), not a failed audit."""


class WorkerError(RuntimeError):
    """A Ray worker failed for a reason other than bad input (it died, ran out of memory, ...).

    The message says what failed and where Ray's logs are; the CLI prints it as one line, exit code 1.
    """


class BackendError(RuntimeError):
    """A tokenizer backend gave ids its tokenizer cannot give (outside the vocabulary): a bug in the
    backend, not in the input. The message names the backend and says to use the reference."""


class PublishFailed(RuntimeError):
    """The complete output could not be renamed into place (a permission, an immutable or busy directory).
    Not bad input: the staging directory keeps the complete output, and the next run finishes the publish.
    The CLI prints it as one line, exit code 2."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; ``kept`` is where the finished work waits for ``--resume`` (None: nothing kept)."""

    def __init__(self, kept: str | None) -> None:
        super().__init__(kept)
        self.kept = kept


def install_extra(extra: str) -> str:
    """The command that installs raypack's optional ``extra`` (text, ray, torch, plot), for a message.
    raypack installs from its checkout: the name ``raypack`` on PyPI is another project, so
    ``pip install raypack[...]`` would install that. From a checkout (an editable install) the
    command names its path."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file():
        return f"pip install -e {shlex.quote(f'{root}[{extra}]')}"
    return f"pip install -e 'PATH/TO/raypack-checkout[{extra}]' (not raypack[{extra}] from PyPI: another project)"
