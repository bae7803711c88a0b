"""Course material the exercises use: starters one exercise behind, and exercise 09's kernel skeleton.

Nothing here grades anything; official grading decides per exercise which of it stays usable
(see :mod:`paged_kv_course.grading.delegation`).
"""
