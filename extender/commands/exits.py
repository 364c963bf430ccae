"""Exit codes of every ``gangslice`` command, and the one error type for bad user input.

A script can tell the outcomes apart without reading stderr: 0 done, 1 the job ran and
failed (an agent cycle that could not publish, a preflight mismatch), 2 bad input (one
line naming the file, the field and the problem), 3 a gang that cannot be placed, 4 the
cluster could not be reached.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNPLACEABLE = 3
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130
#: What a shell reports for a process the reader of its pipe went away from (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code :data:`EXIT_BAD_INPUT`."""
