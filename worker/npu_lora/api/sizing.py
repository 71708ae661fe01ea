"""Shape rules for long rows, torch-free: shared by the engine (what it runs), the compile plan
(what it lists) and the memory estimate (what it counts), so the three cannot disagree.

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

from npu_lora.api import backends as registry

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
