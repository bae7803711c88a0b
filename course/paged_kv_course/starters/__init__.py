"""Starters: the learner's MyAllocator as it stands once exercise NN is done (after_NN.AllocatorAfterNN).

A learner stuck on an exercise starts from the one before it; while exercise NN is graded the
starters of NN and later are not usable.
"""
