"""Trace readers and the normalized event table.

Importing this package registers kvprof's own trace readers (kvprof.trace.readers) into
kvprof.core.readers' registry.
"""

from kvprof.trace import readers as readers
