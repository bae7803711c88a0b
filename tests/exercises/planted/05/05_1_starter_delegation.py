# expect: uses paged_kv_lib.conformance.starter
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_lib.conformance.starter import GrowingStarterAllocator as MyAllocator
