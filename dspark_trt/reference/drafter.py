"""The reference DSpark drafter: pure PyTorch, module names mirroring the checkpoint (docs/dspark.md §4–§7).

One round for a batch of independent requests, each with ``p`` context tokens (target positions
``0 … p-1``, whose taps are already fused into the K/V cache) and an anchor at position ``p``::

    context_kv(taps, positions)      taps [B, T, m·d] → per-layer K/V [L, B, T, H_kv, D]     (once per token)
    block_hidden(anchor, K, V, p)    query block → final-normed hidden H [B, N, d]
    base_logits(H)                   U = s · lm_head(H) (Gemma-4: soft-capped)   [B, N, V_d]
    draft(...)                       U → Markov walk → tokens, candidates, confidence

Layouts (§3.4): anchor-first (``sample_from_anchor``) feeds ``[a, M × (N-1)]`` at positions
``p … p+N-1`` and slot j predicts ``d_{j+1}``; bonus-anchor feeds ``[a, M × N]`` at ``p … p+N`` and slot
``j ≥ 1`` predicts ``d_j``. Either way ``block_hidden`` returns the N prediction slots in order, so
everything downstream is layout-free.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from ..config import DSparkConfig
from .gemma4_layers import Gemma4DraftLayer, Gemma4RMSNorm
from .layers import DSparkDecoderLayer, RMSNorm, block_attention_mask
from .markov import MarkovWalkResult, markov_union_table, select_candidates, walk_candidates
from .markov_heads import HeadFeatures, head_features, rnn_initial_state

__all__ = ["DSparkDrafter", "MarkovHead", "ConfidenceHead", "context_length", "layer_context", "draft_layer"]


def context_length(ctx: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """T of a context ``[L, B, T, H_kv, D]`` or of per-layer heads-first ``L × [B, H_kv, T, D]``."""
    return ctx.shape[2] if isinstance(ctx, torch.Tensor) else ctx[0].shape[2]


def layer_context(ctx: torch.Tensor | Sequence[torch.Tensor], layer: int) -> torch.Tensor:
    """Layer ``layer``'s context heads first, ``[B, H_kv, T, D]`` (a view: no copy)."""
    return ctx[layer].transpose(1, 2) if isinstance(ctx, torch.Tensor) else ctx[layer]


class MarkovHead(nn.Module):
    """Low-rank Markov head: bias_j = W2 · u_j, u_j = W1[d_j] (vanilla) or the gated / RNN feature of
    ``reference/markov_heads.py`` (docs/dspark.md §5); module names as speculators and NeMo AutoModel save them."""

    def __init__(self, vocab: int, draft_vocab: int, rank: int, head_type: str = "vanilla", hidden_size: int = 0):
        super().__init__()
        self.head_type = head_type
        self.markov_w1 = nn.Embedding(vocab, rank)  # [V, r], indexed by the predecessor's *target* id
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)  # weight [V_d, r]
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)  # over [h ; W1[d]]
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)  # over [s ; W1[d] ; h] → [γ ; c ; o]

    @property
    def projection(self) -> nn.Linear | None:
        """gate_proj (gated), joint_proj (rnn) or None (vanilla)."""
        return getattr(self, "gate_proj", None) or getattr(self, "joint_proj", None)


class ConfidenceHead(nn.Module):
    """c_j = σ(w · [H_j ; W1[d_j]] + b) (docs/dspark.md §6)."""

    def __init__(self, in_features: int):
        super().__init__()
        self.proj = nn.Linear(in_features, 1, bias=True)


def draft_layer(c: DSparkConfig) -> nn.Module:
    """One draft layer of ``c.layer_family``: a Qwen3 layer (``layers.py``) or a Gemma-4 one (``gemma4_layers.py``)."""
    if c.layer_family == "gemma4":
        return Gemma4DraftLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                c.head_dim, c.rms_norm_eps, c.rope_theta, c.partial_rotary_factor, c.attention_k_eq_v)
    return DSparkDecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                              c.head_dim, c.rms_norm_eps, c.rope_theta)


def family_norm(c: DSparkConfig) -> nn.Module:
    """The drafter-level RMSNorm (``hidden_norm``, ``norm``) of ``c.layer_family``."""
    return Gemma4RMSNorm(c.hidden_size, c.rms_norm_eps) if c.layer_family == "gemma4" else RMSNorm(c.hidden_size,
                                                                                                  c.rms_norm_eps)


class DSparkDrafter(nn.Module):
    """The drafter; its draft layers, norms, embedding scale and logit soft-cap follow ``config.layer_family``
    (Qwen3, or DeepSpec's Gemma-4: ``reference/gemma4_layers.py``); the heads and the walk are shared."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.fc = nn.Linear(c.num_taps * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = family_norm(c)
        self.layers = nn.ModuleList(draft_layer(c) for _ in range(c.num_hidden_layers))
        self.norm = family_norm(c)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.markov_head = MarkovHead(c.vocab_size, c.draft_vocab_size, c.markov_rank, c.markov_head_type,
                                      c.hidden_size)
        self.confidence_head = ConfidenceHead(c.confidence_input_size) if c.enable_confidence_head else None
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))  # [V_d] offsets

    # -- pieces ---------------------------------------------------------------------------------------
    @property
    def d2t_or_none(self) -> torch.Tensor | None:
        return self.d2t if self.config.has_reduced_vocab else None

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """taps [B, T, m·d] (tapped target hidden states, concatenated in target_layer_ids order),
        positions [B, T] int64 → K, V [L, B, T, H_kv, D] for every draft layer.

        The fusion runs in ``fc``'s dtype (fp32 in an fp16 drafter: ``reference/precision.py``), the K/V
        projections in the model dtype."""
        h = self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))  # [B, T, d] fused context, fc dtype
        h = h.to(self.embed_tokens.weight.dtype)  # normed: RMS ~1, safe in fp16
        kv = [layer.self_attn.key_value(h, positions) for layer in self.layers]
        return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings of the block [B, Q] → [B, Q, d]; a Gemma-4 drafter's × √d, the scale first cast to the
        model dtype (``Gemma4TextScaledWordEmbedding``: √3840 is 62.0 in bf16)."""
        x = self.embed_tokens(ids)
        scale = self.config.embed_scale
        if scale is None:
            return x
        return x * torch.tensor(scale, dtype=torch.float32).to(x.dtype)

    def block_ids(self, anchor: torch.Tensor, ctx_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Query block ids [B, Q] = [a, M, …, M] and positions [B, Q] = p, p+1, … (Q = block_size)."""
        c = self.config
        B = anchor.shape[0]
        slots = torch.arange(c.block_size, device=anchor.device)
        ids = torch.where(slots == 0, anchor.view(B, 1).to(torch.int64), c.mask_token_id)
        return ids, ctx_len.view(B, 1).to(torch.int64) + slots

    def block_forward(
        self,
        ids: torch.Tensor,  # [B, Q] int64 query-block token ids
        positions: torch.Tensor,  # [B, Q] int64
        ctx_k: torch.Tensor | Sequence[torch.Tensor],  # [L, B, T, H_kv, D], or L × [B, H_kv, T, D] heads first
        ctx_v: torch.Tensor | Sequence[torch.Tensor],  # the same
        ctx_len: torch.Tensor,  # [B] int64: valid context tokens per request (rest is padding)
        ctx_start: torch.Tensor | None = None,  # [B] int64: the position of context row 0 (None = 0)
    ) -> torch.Tensor:
        """Final-normed hidden states of every block slot, [B, Q, d]; each layer masked as its config says
        (``DSparkConfig.layer_attention``: bidirectional and full, or causal/windowed). Context row r holds
        position ``ctx_start + r`` (a sliding cache: ``runtime/drafter_state.py``); ``ctx_len`` is a position.

        The context is ``[L, B, T, H_kv, D]`` (each layer read as its heads-first view ``[B, H_kv, T, D]``:
        no copy when the tensor is a view of heads-first storage, as ``runtime/drafter_state.py``'s is) or a
        sequence of per-layer heads-first tensors (the exported draft graph's ``ctx_key_<l>`` inputs)."""
        Q, T = ids.shape[1], context_length(ctx_k)
        masks: dict[tuple[int | None, bool], torch.Tensor] = {}  # [B, Q or 1, T+Q] per attention pattern
        x = self.embed(ids)  # [B, Q, d]
        for i, layer in enumerate(self.layers):
            pattern = self.config.layer_attention(i)
            if pattern not in masks:
                masks[pattern] = block_attention_mask(ctx_len, T, Q, *pattern, ctx_start)
            x = layer(x, positions, layer_context(ctx_k, i), layer_context(ctx_v, i), masks[pattern])
        return self.norm(x)

    def block_hidden(
        self,
        anchor: torch.Tensor,  # [B] int64 target id at position p
        ctx_k: torch.Tensor,  # [L, B, T, H_kv, D]
        ctx_v: torch.Tensor,  # [L, B, T, H_kv, D]
        ctx_len: torch.Tensor,  # [B] int64: p
        ctx_start: torch.Tensor | None = None,  # [B] int64: the position of context row 0 (None = 0)
    ) -> torch.Tensor:
        """Final-normed hidden states of the N prediction slots, [B, N, d] (layout handled here)."""
        return self.prediction_slots(self.block_states(anchor, ctx_k, ctx_v, ctx_len, ctx_start))

    def block_states(self, anchor: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor, ctx_len: torch.Tensor,
                     ctx_start: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed hidden states of every query slot, [B, Q, d] (``block_hidden`` before the layout)."""
        ids, positions = self.block_ids(anchor, ctx_len)
        return self.block_forward(ids, positions, ctx_k, ctx_v, ctx_len, ctx_start)

    def prediction_slots(self, states: torch.Tensor) -> torch.Tensor:
        """[B, Q, d] block states → [B, N, d], the prediction slots (bonus-anchor: without the anchor slot 0)."""
        return states if self.config.sample_from_anchor else states[:, 1:]

    def head_features(self, anchor: torch.Tensor, states: torch.Tensor) -> HeadFeatures | None:
        """The gated / RNN head's walk inputs from the block states [B, Q, d] (None for vanilla): the hidden part
        of its projection per prediction slot, the walk's weight, and (rnn, bonus-anchor) the state after the
        anchor slot (``reference/markov_heads.py``)."""
        head = self.markov_head
        proj = head.projection
        if proj is None:
            return None
        state0 = None
        if head.head_type == "rnn" and not self.config.sample_from_anchor:
            state0 = rnn_initial_state(head.markov_w1.weight[anchor.to(torch.int64)], states[:, 0], proj.weight,
                                       proj.bias)
        return head_features(head.head_type, self.prediction_slots(states), proj.weight, proj.bias, state0=state0)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """U = s · lm_head(H): [B, N, d] → [B, N, V_d] in the module dtype; with ``final_logit_softcapping`` cap
        (Gemma-4) U = s · cap · tanh(lm_head(H) / cap), DeepSpec's ``compute_logits``: the Markov bias is added to
        the capped logits, as DeepSpec's head adds it."""
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits * self.config.logit_scale

    def confidence_parts(self, hidden: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Split c_j = σ(w_h·H_j + b + w_e·W1[d_j]): returns (w_h·H + b [B, N] fp32, w_e [r]) or (None, None)."""
        if self.confidence_head is None:
            return None, None
        w = self.confidence_head.proj.weight[0].to(torch.float32)  # [d (+ r)]
        d = self.config.hidden_size
        base = hidden.to(torch.float32) @ w[:d] + self.confidence_head.proj.bias.to(torch.float32)
        return base, (w[d:] if self.config.confidence_head_with_markov else None)

    # -- one round ------------------------------------------------------------------------------------
    def draft(
        self,
        anchor: torch.Tensor,  # [B] int64
        ctx_k: torch.Tensor,  # [L, B, T, H_kv, D]
        ctx_v: torch.Tensor,  # [L, B, T, H_kv, D]
        ctx_len: torch.Tensor,  # [B] int64
        *,
        topk: int | None = None,
        temperature: torch.Tensor | None = None,  # [B] fp32
        seed: torch.Tensor | None = None,  # [B] int64
        walk: Callable[..., MarkovWalkResult] = walk_candidates,
        select: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] = select_candidates,
        markov_topm: int = 0,
        ctx_start: torch.Tensor | None = None,  # [B] int64: the position of context row 0 (None = 0)
    ) -> MarkovWalkResult:
        """Draft N tokens per request: backbone, base logits, candidates (top-k or all), Markov walk, confidence.

        ``select`` and ``walk`` (signatures of ``reference.markov.select_candidates`` and ``walk_candidates``)
        let an executor swap in native kernels. ``markov_topm`` M > 0 adds the candidate union
        (``union_table``; the walk then also gets ``union_table`` and ``base_logits``). A gated or RNN head's
        walk also gets ``head=`` (``HeadFeatures``); a vanilla walk never does.
        """
        walk_options: dict = {}
        states = self.block_states(anchor, ctx_k, ctx_v, ctx_len, ctx_start)  # [B, Q, d]
        hidden = self.prediction_slots(states)  # [B, N, d]
        head = self.head_features(anchor, states)
        if head is not None:
            walk_options["head"] = head
        conf_base, conf_w = self.confidence_parts(hidden)
        base = self.base_logits(hidden)  # [B, N, V_d]
        cand_vals, cand_ids = select(base, topk)  # [B, N, k]
        union = {} if not markov_topm else {"union_table": self.union_table(markov_topm), "base_logits": base}
        return walk(
            cand_vals,
            cand_ids,
            anchor,
            self.markov_head.markov_w1.weight,
            self.markov_head.markov_w2.weight,
            logit_scale=self.config.logit_scale,
            d2t=self.d2t_or_none,
            temperature=temperature,
            seed=seed,
            positions=ctx_len.to(torch.int64) + 1,  # d_1 sits right after the anchor
            conf_base=conf_base,
            conf_w_markov=conf_w,
            **union,
            **walk_options,
        )

    def union_table(self, topm: int) -> torch.Tensor:
        """[V, M] int32 ``markov_union_table`` of this head, built once per M (weights are frozen)."""
        cache = self.__dict__.setdefault("_union_tables", {})
        if topm not in cache:
            with torch.no_grad():
                cache[topm] = markov_union_table(self.markov_head.markov_w1.weight, self.markov_head.markov_w2.weight,
                                                 topm, logit_scale=self.config.logit_scale)
        return cache[topm]
