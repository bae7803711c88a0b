# expect: uses paged_kv_lib.conformance.starter
from paged_kv_lib.conformance.starter import GrowingStarterAllocator as MyAllocator
