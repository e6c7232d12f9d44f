"""Ingest: a raw log bundle becomes the lake tables steps, sessions, feed_layouts,
items, profiles, history and the ingest part of quarantine.

Two passes, so memory is bounded by a part, not by the bundle:

1. *read* (``parts``): the raw part files are read and typed in two threads, in chunks (a big
   Parquet file by row groups, a group larger than a chunk in slices, small files several at a
   time), rejects collected.
   ``events`` and ``feeds`` rows are split into parts by a hash of ``page_view_id``, kept in
   memory up to ``memory_rows`` and otherwise spilled under
   ``LAKE/.staging/spill-<token>/<table>/part=<p>/``. Beyond ``memory_rows``, feeds whose files
   are all Parquet, with string ids and each view's cards together (the usual layout), are not
   spilled: a view belongs to the part its first card falls in, only ``page_view_id`` is read
   here, and pass 2 reads each part's feed rows in place, in order (``feeds_in_place``); the
   events are spilled by that map. ``items`` that make one chunk stay in memory, their ids and
   image refs keyed in the writer thread meanwhile; items that make several are left to pass 2,
   which reads them once (their text is too large to keep or spill), after a read of their id
   column alone for the duplicate check. Profiles stay in memory; history stays there too unless
   the parts are spilled, when it is spilled beside them and read back a file at a time. The event ids' hashes
   of a spilled bundle go to disk as they are read, by range of the hash space
   (``duplicate_ids.IdHashes``), and the distinct users and named items are merged as they come.
2. *align*: items are checked and written chunk by chunk, leaving a compact item index (ids
   sorted by hash, pseudonyms, what the checks need: ``item_index``). A bundle read in several
   parts keeps that index on disk, in shards by hash (``item_shards``), and each part takes from
   it only the items its rows name, so no process holds the whole catalog's; where the parts' rows
   lie on disk, a group of parts takes its items in one sweep over the shards, a group ahead of the
   parts aligning (``lookups_ahead``). Then, part by part, the checks and the step alignment of
   ``transforms.align`` run on the part's page views (``alignment``, pure), and its rows are
   pseudonymized (``keying``) and added to the staged tables as ``part-<p>.parquet`` files
   (``run``). Given a map over parts (the flows' Ray or local workers), each part is a task of its
   own instead, reading the shared context and its rows from files under the spill
   (``part_tasks``); the lake is the same, file for file.

Part size: ``IngestSettings.spill_part_rows`` feed + event rows per part (750,000: a few parts
at UserArena scale, kept in memory; one for small bundles). Two parts align at once, so the part
size is most of what pass 2 holds beyond the shared context.

Whatever a check compares lies within one page view, hence within one part, except ids:
duplicate event and item ids are found from a hash of the id kept for every row, and the
few rows involved are settled together (``duplicate_ids``); missing-profile flags are kept once
per user. Two parts align at once (``run.ALIGN_THREADS``: Polars runs many small steps on one
core, so one part at a time leaves the other idle); their pseudonyms and Parquet writes run in
one writer thread (``writer``), in part order. Tables are swapped into place at the end, one
atomic rename each; a failure leaves the previous lake and no staging or spill behind. What is
counted, and the balance it must strike, is in ``accounting``.
"""

from transforms.ingest.accounting import OUTPUT_OF, AccountingError, IngestResult, TableCount
from transforms.ingest.run import ingest_bundle

__all__ = ["OUTPUT_OF", "AccountingError", "IngestResult", "TableCount", "ingest_bundle"]
