"""Kernels: each file holds a pure-PyTorch reference of one function and, beside it, its Triton kernel.

The references are public API (the kernel-level oracle): they define the layouts and semantics that the
Triton kernels, and other engines' kernels, are tested against.

Layouts shared by all kernels:
- paged KV cache, one per layer and for K and V: `(num_blocks, block_size, num_kv_heads, head_dim)`;
  token at absolute position p of a sequence lives in block `block_table[p // block_size]`, row
  `p % block_size`; its flat slot is `block_id * block_size + p % block_size`.
- a batch of variable-length queries is packed: `q (num_tokens, num_heads, head_dim)`, with
  `query_start_loc (num_seqs + 1,)` int32 offsets; `seq_lens (num_seqs,)` int32 is each sequence's context
  length including this step's tokens (so the queries of sequence s sit at the last q_len positions);
  `block_tables (num_seqs, max_blocks_per_seq)` int32, entries past a sequence's blocks are ignored.
- GQA: query head h reads KV head `h // (num_heads // num_kv_heads)` (as transformers' repeat_kv).
"""
