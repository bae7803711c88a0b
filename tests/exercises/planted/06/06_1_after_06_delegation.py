# expect: uses paged_kv_course.starters.after_06
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_course.starters.after_06 import AllocatorAfter06 as MyAllocator
