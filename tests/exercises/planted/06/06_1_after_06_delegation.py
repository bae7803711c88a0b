# expect: uses paged_kv_lib.course.starters.after_06
from paged_kv_lib.course.starters.after_06 import AllocatorAfter06 as MyAllocator
