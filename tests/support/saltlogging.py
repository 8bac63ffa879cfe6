"""Salt's logging inside the pytest process.

``import salt`` (any salt module) runs salt/_logging/impl.py, which, when the root logger has no handler
yet (true in a pytest process: pytest attaches its handlers per test phase), does two things meant for
the first moments of a salt command line program:

- installs a ``DeferredStreamHandler`` on the root logger, bound to whatever ``sys.stderr`` is at that
  moment; it *queues* every record (level WARNING) until salt's own logging setup syncs or flushes it, and
  registers an atexit hook that flushes the queue. A salt daemon or CLI shuts it down once its logging is
  configured; in-process use (the loaders in unit tests) never does. So every warning of the session
  (``saltvirt`` warnings, pillar render errors) piled up in that queue and was written out at interpreter
  exit, to a stream that pytest's capture or the xdist worker had already closed: one
  "--- Logging error --- ValueError: I/O operation on closed file" traceback per record;
- sets the root logger to level GARBAGE (1), so every debug/trace call anywhere builds a record.

``quiet_salt_logging`` undoes both, as salt's own ``setup_logging`` would: the temporary handler is shut
down (its queue handed to the root handlers and closed) and the root logger gets Python's default level
back. Records then reach pytest's log capture like any other library's, and show up in the report of the
test that emitted them ("Captured log call").
"""

import logging


def quiet_salt_logging():
    import salt._logging  # the import installs the temporary handler if nothing else configured logging yet

    salt._logging.shutdown_temp_handler()
    if logging.root.level < logging.WARNING:
        logging.root.setLevel(logging.WARNING)
