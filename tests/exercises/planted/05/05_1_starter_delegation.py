# expect: uses paged_kv_course.starters.after_05
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_course.starters.after_05 import AllocatorAfter05 as MyAllocator
