"""The shape rules, torch-free: the one home of every pure rule the engine (what it runs), the
compile plan (what it lists), the RNGD catalogue (what it checks) and the memory estimate (what
it counts) share, so they cannot disagree. ``lint-imports`` (contract ``torch-free``) keeps this
module, the rest of ``api/`` and the compile plan free of torch, so the operator may import them.

Hot experts and buckets:

- ``hot_count(fraction, E)``: the hot experts of a layer for ``moe.hotFraction``,
  ``ceil(fraction·E)`` clamped to [1, E].
- ``tokens_per_pass(batch, seq_len)``: the tokens one micro-batch hands each MoE block (T).
- ``default_buckets(T, top_k)``: the padded rows a hot expert may get (powers of two from 8 up
  to the first ≥ min(T, T·top_k)); ``hot_buckets(bucket_sizes, T, top_k)``: ``moe.bucketSizes``
  sorted, else those.
- ``label_bucket(n, S)`` / ``label_buckets(S)``: the label positions the LM head is built for.

Long rows:

``attention_impl(backend, S)``: which attention core a ``DeviceAttentionBlock`` runs.

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with the additive mask and
  ``enable_gqa`` — on cpu (torch's flash-attention CPU kernel: blocks of keys, an online
  softmax, only the output and the log-sum-exp kept for backward) and cuda (flash /
  memory-efficient). Its memory is O(S) per head instead of O(S²): measured on this project's
  CPU wheel (torch 2.13, tiny widths, S=4,096, one layer) the eager core's forward+backward
  peaked 1,024 MB over its inputs, sdpa's did not register. Used from :data:`SDPA_MIN_SEQ`
  tokens a row on backends whose registry entry has ``sdpa`` (cpu, cuda).
- ``eager``: ``ops.eager_attention`` (scores, fp32 softmax, ``P v``; a FlashAttention-style
  explicit backward), the form RNGD's compiler takes (furiosa-torch 2026.4 fails sdpa as a
  whole graph), and below :data:`SDPA_MIN_SEQ` everywhere (bitwise the stock eager module,
  what the short-row tests pin).

``head_chunk_rows(B, N, V)``: the label positions per chunk of the LM-head loss. The logits of a
chunk are ``B × rows × V`` fp32; the head computes them one chunk at a time when all ``N`` would
exceed :data:`HEAD_CHUNK_BYTES` (a power of two that divides the label bucket ``N``, itself a
power of two or ``S``), so a row's logits are never all alive at once.

``head_loss_blocks(backend)``: how those chunks are cut. ``"vocab"`` (cpu, cuda: the backends
whose registry entry has ``sdpa``, i.e. that run torch's own forms rather than only what RNGD's
compiler takes): every label position at once against blocks of the vocabulary
(:func:`head_vocab_rows` weight rows a block, the same byte budget), an online log-sum-exp, the
gradient ``softmax(z) W`` accumulated online (FlashAttention's output rule): one pass over the
weight with all positions as the matmul's rows, instead of two passes per chunk of
``head_chunk_rows`` positions (measured 2026-12-05, experiments/2026-12-05-long-step.md).
``"rows"`` (furiosa): the position chunks, the static-shape form the compile plan lists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from npu_lora.api import backends as registry

__all__ = [
    "HEAD_CHUNK_BYTES",
    "SDPA_MIN_SEQ",
    "attention_impl",
    "default_buckets",
    "head_chunk_rows",
    "hot_buckets",
    "hot_count",
    "label_bucket",
    "label_buckets",
    "next_pow2",
    "rope_impl",
    "tokens_per_pass",
]

#: rows of a sequence from which cpu/cuda run sdpa's memory-efficient attention
SDPA_MIN_SEQ = 1024
#: the most bytes of fp32 logits the LM head holds at once (one chunk)
HEAD_CHUNK_BYTES = 64 << 20


def attention_impl(backend: str, seq_len: int) -> str:
    """``"sdpa"`` or ``"eager"`` for a row of ``seq_len`` tokens on ``backend`` (a registry
    name; an unregistered one takes ``eager``)."""
    if backend in registry.names() and registry.entry(backend).sdpa and seq_len >= SDPA_MIN_SEQ:
        return "sdpa"
    return "eager"


def head_loss_blocks(backend: str) -> str:
    """``"vocab"`` or ``"rows"``: how the LM-head loss is chunked on ``backend`` (module doc)."""
    if backend in registry.names() and registry.entry(backend).sdpa:
        return "vocab"
    return "rows"


def rope_impl(backend: str) -> str:
    """``"slice"`` or ``"matmul"``: how attention's rotate_half is written on ``backend``.
    ``"slice"`` (transformers' ``cat(-x2, x1)``) where the backend runs stock ops (registry
    ``sdpa``: cpu, cuda); ``"matmul"`` (``x @ R``, a fixed signed permutation: bitwise the same
    values) elsewhere, the form RNGD's compiler schedules (the slice form's backward fails it)."""
    if backend in registry.names() and registry.entry(backend).sdpa:
        return "slice"
    return "matmul"


def label_gather_impl(backend: str) -> str:
    """``"index"`` or ``"onehot"``: how the LM head picks the label positions' rows of ``h``.
    ``"index"`` (``torch.gather``, backward a scatter-add) on backends whose registry entry has
    ``device_gather`` (index gathers verified on the device: cpu, cuda); ``"onehot"`` (a
    ``bmm`` by the one-hot ``sel_BNS``, the form RNGD's compiler takes) elsewhere."""
    if backend in registry.names() and registry.entry(backend).device_gather:
        return "index"
    return "onehot"


def head_vocab_rows(positions: int, vocab: int, limit: int = HEAD_CHUNK_BYTES) -> int:
    """Vocabulary rows per block of the ``"vocab"`` form: the most whose fp32 logits for
    ``positions`` label positions (batch included) fit ``limit`` bytes, a multiple of 64 when
    that is at least 64 (at least 1, at most ``vocab``)."""
    rows = max(limit // max(positions * 4, 1), 1)
    if rows >= 64:
        rows -= rows % 64
    return min(rows, vocab)


def head_chunk_rows(batch: int, n: int, vocab: int, limit: int = HEAD_CHUNK_BYTES) -> int:
    """Label positions per LM-head chunk: ``n`` when ``batch·n·vocab·4 <= limit``, else the
    largest power of two ``c < n`` dividing ``n`` with ``batch·c·vocab·4 <= limit`` (at least 1)."""
    if batch * n * vocab * 4 <= limit:
        return n
    c = 1
    while c * 2 < n and n % (c * 2) == 0 and batch * c * 2 * vocab * 4 <= limit:
        c *= 2
    return c


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def hot_count(fraction: float, num_experts: int) -> int:
    """``moe.hotFraction`` as experts of a layer: ``ceil(fraction * E)`` clamped to [1, E] (with
    a 1e-9 guard against float noise)."""
    return min(num_experts, max(1, math.ceil(fraction * num_experts - 1e-9)))


def tokens_per_pass(batch_size: int, seq_len: int) -> int:
    """The tokens of one micro-batch, every one of which passes each MoE block (T = B·S)."""
    return int(batch_size) * int(seq_len)


def default_buckets(tokens: int, top_k: int = 1, *, smallest: int = 8) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to the first ≥ min(tokens, tokens*top_k).

    A hot expert receives at most ``tokens`` pairs (a token picks an expert at most once), so
    buckets beyond ``tokens`` are never needed."""
    cap = next_pow2(max(1, min(tokens, tokens * top_k)))
    out, b = [], min(smallest, cap)
    while b < cap:
        out.append(b)
        b *= 2
    out.append(cap)
    return tuple(out)


def hot_buckets(bucket_sizes: Sequence[int] | None, tokens: int, top_k: int) -> tuple[int, ...]:
    """The hot experts' buckets: ``moe.bucketSizes`` sorted, else :func:`default_buckets`."""
    if bucket_sizes:
        return tuple(sorted(int(b) for b in bucket_sizes))
    return default_buckets(tokens, top_k)


def label_bucket(n_labels: int, seq_len: int) -> int:
    """The label positions the LM head is built for when a row holds ``n_labels``: the next
    power of two, at most ``seq_len`` (at least 1)."""
    return min(max(next_pow2(n_labels), 1), seq_len)


def label_buckets(seq_len: int) -> list[int]:
    """Every :func:`label_bucket` a row of ``seq_len`` tokens can pick (1 ≤ n < S)."""
    return sorted({label_bucket(n, seq_len) for n in range(1, max(seq_len, 2))})
