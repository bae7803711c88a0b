# expect: the allocator is the part that breaks
def my_allocator_class():
    """Your allocator class of exercises 02-06 (fork, growth, copy-on-write, prefix caching), pasted here."""
    import hashlib
    from collections import deque

    class MyAllocator:
        """Books of a paged pool: a free queue, reference counts, block tables, lengths and a prefix cache."""

        def __init__(self, num_blocks, block_size):
            if type(num_blocks) is not int or type(block_size) is not int or num_blocks < 1 or block_size < 1:
                raise ValueError(f"num_blocks and block_size must be ints >= 1, got {num_blocks!r}, {block_size!r}")
            self.num_blocks, self.block_size = num_blocks, block_size
            self.free = deque(range(num_blocks))
            self.ref_counts = [0] * num_blocks
            self.tables, self.lengths = {}, {}
            self.block_of_key, self.key_of_block = {}, {}

        @property
        def num_free_blocks(self):
            return len(self.free)

        def _blocks(self, tokens):
            return -(-tokens // self.block_size)

        def take_blocks(self, count):
            """Blocks off the head of the free queue, each held once; the content they cached is forgotten."""
            taken = [self.free.popleft() for _ in range(count)]
            for block in taken:
                self.ref_counts[block] = 1
                key = self.key_of_block.pop(block, None)
                if key is not None:
                    del self.block_of_key[key]
            return taken

        def _refuse(self, needed, what):
            raise OutOfBlocksError(needed, len(self.free), what)

        def allocate_for_sequence(self, seq_id, num_prompt_tokens, token_ids=None):
            if seq_id in self.tables:
                raise DuplicateSequenceError(f"sequence {seq_id!r} already holds blocks")
            if type(num_prompt_tokens) is not int or num_prompt_tokens < 0:
                raise ValueError(f"num_prompt_tokens must be an int >= 0, got {num_prompt_tokens!r}")
            keys, hits = [], []
            if token_ids is not None:
                tokens = list(token_ids)
                if len(tokens) != num_prompt_tokens:
                    raise ValueError(f"{len(tokens)} token ids for a prompt of {num_prompt_tokens} tokens")
                parent = bytes(32)
                for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
                    digest = hashlib.sha256(parent + (0).to_bytes(8, "little"))
                    for token in tokens[start:start + self.block_size]:
                        digest.update(int(token).to_bytes(8, "little", signed=True))
                    parent = digest.digest()
                    keys.append(parent)
                for key in keys:
                    if key not in self.block_of_key:
                        break
                    hits.append(self.block_of_key[key])
            new = self._blocks(num_prompt_tokens) - len(hits)
            idle = [b for b in hits if self.ref_counts[b] == 0]
            if new + len(idle) > len(self.free):
                self._refuse(new, f"allocate sequence {seq_id}")
            for block in idle:
                self.free.remove(block)
            for block in hits:
                self.ref_counts[block] += 1
            table = hits + self.take_blocks(new)
            for key, block in zip(keys[len(hits):], table[len(hits):]):
                if key not in self.block_of_key:
                    self.block_of_key[key], self.key_of_block[block] = block, key
            self.tables[seq_id], self.lengths[seq_id] = table, num_prompt_tokens
            return len(hits) * self.block_size

        def get_block_mapping(self, seq_id):
            if seq_id not in self.tables:
                raise UnknownSequenceError(f"sequence {seq_id!r} holds no blocks")
            return list(self.tables[seq_id])

        def append_tokens(self, seq_id, num_tokens=1):
            if seq_id not in self.tables:
                raise UnknownSequenceError(f"sequence {seq_id!r} holds no blocks")
            if type(num_tokens) is not int or num_tokens < 0:
                raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
            table, length = self.tables[seq_id], self.lengths[seq_id]
            missing = max(0, self._blocks(length + num_tokens) - len(table))
            copy = num_tokens > 0 and length % self.block_size != 0 and self.ref_counts[table[-1]] > 1
            if missing + copy > len(self.free):
                self._refuse(missing + copy, f"grow sequence {seq_id} by {num_tokens} tokens")
            fresh = []
            if copy:  # the shared last block is written next: this sequence gets its own copy first
                fresh = self.take_blocks(1)
                self.ref_counts[table[-1]] -= 1
                table[-1] = fresh[0]
            grown = self.take_blocks(missing)
            table.extend(grown)
            self.lengths[seq_id] = length + num_tokens
            return fresh + grown

        def fork(self, parent_seq_id, child_seq_id):
            if parent_seq_id not in self.tables:
                raise UnknownSequenceError(f"sequence {parent_seq_id!r} holds no blocks")
            if child_seq_id in self.tables:
                raise DuplicateSequenceError(f"sequence {child_seq_id!r} already holds blocks")
            self.tables[child_seq_id] = list(self.tables[parent_seq_id])
            self.lengths[child_seq_id] = self.lengths[parent_seq_id]

        def free_sequence(self, seq_id):
            for block in reversed(self.tables.pop(seq_id, [])):
                self.ref_counts[block] -= 1
                if self.ref_counts[block] == 0:
                    self.free.append(block)
            self.lengths.pop(seq_id, None)

    return MyAllocator
