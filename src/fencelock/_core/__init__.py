"""The pure algorithm: no I/O, no clock reads, no redis/asyncio/threading imports.

Everything here takes times and replies as arguments and returns decisions, so the sync and the
asyncio front ends share one implementation and tests can drive it with no sockets or sleeps.
A test (tests/unit/test_core_purity.py) fails if any module here imports I/O machinery.
"""
