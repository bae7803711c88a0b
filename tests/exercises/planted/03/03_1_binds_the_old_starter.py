# expect: paged_kv_lib.conformance.starter
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
from paged_kv_lib.conformance.starter import SharingStarterAllocator


class MyAllocator(MyAllocator):
    fork = SharingStarterAllocator.fork
    free_sequence = SharingStarterAllocator.free_sequence
