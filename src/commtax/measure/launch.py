"""``python -m commtax.measure.launch ARGS``: torchrun (``torch.distributed.run``) as commtax's benches and
``cluster run`` start it, quiet when commtax stops it.

commtax stops a run it launched (Ctrl-C, SIGTERM, SIGHUP) by SIGTERMing torchrun, whose agent then raises
``SignalException``: uncaught, Python printed its 30-line traceback after commtax's one line. Here that exception
is exit status 130 and nothing more. A rank that failed is exit status 1 after the rank's own message and torch's
one "failed (exitcode: N) local_rank: …" line, without the traceback and the 20-line summary block after them.
torch elastic's warnings (the OMP_NUM_THREADS banner, "Received 15 death signal", "Sending process … closing
signal") are left out by ``LOGLEVEL=ERROR`` (torch.distributed.elastic.utils.logging reads it at import); its
errors still show. A ``LOGLEVEL`` the user set is kept.
"""

from __future__ import annotations

import logging
import os
import sys

EXIT_STOPPED = 130  # errors.EXIT_INTERRUPTED: the launching command reports the interrupt once


def main(argv: list[str]) -> int:
    quiet = "LOGLEVEL" not in os.environ
    if quiet:
        os.environ["LOGLEVEL"] = "ERROR"  # before torch's loggers are made (get_logger sets each one's level)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if quiet:  # the loggers made with logging.getLogger (multiprocessing.api's "Sending process …") inherit this
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)

    try:
        torchrun(argv)
    except SignalException:
        return EXIT_STOPPED
    except ChildFailedError:  # the rank said why, and torch logged "failed (exitcode: N) local_rank: …" in one line
        return 1  # torchrun's own status for a failed rank
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
