"""A fresh DSpark drafter for a given Hugging Face target: its config and starting weights.

Choices for a small CPU target (SmolLM2-135M: 30 layers, d = 576, V = 49152), all options:

- ``num_layers = 1``: the draft round must cost a small fraction of one target step; one layer of the
  target's width is 1/30 of its layers. It starts as a copy of the target's last decoder layer (attention and
  MLP weights; DSpark's extra q/k norms start at 1) and the target's final norm, which trains much faster
  than a random start.
- taps: three layers spread over the target (early, middle, the one before last; never the last), the
  DSpark default; ``fc`` starts as a copy of the last tap (the nearest to the target's own output).
- ``markov_rank = 64``: the Markov bias is a rank-r lookup plus an [r, V_d] product per slot; 64 keeps it
  far below the lm_head cost.
- ``markov_head_type = "vanilla"`` (``gated``, ``rnn``: the heads speculators trains; ``reference/markov_heads.py``).
  A gated or RNN head starts as the vanilla one: the hidden-state columns of its projection at 0, so the
  gate reads only the predecessor (gate bias 0: g = σ(G_e·e), ≈ ½) and the RNN's output is tanh(e + …) ≈ e
  (its e → o block the identity); training then learns what the context adds.
- ``draft_vocab_size``: the draft vocabulary is the most frequent tokens of the target-written training
  text (``d2t`` maps draft ids to target ids); a smaller ``lm_head`` is the largest saving in the round.
- ``block_size = 7`` anchor-first slots (N = 7), the released DSpark layout.
- ``context_window = 256``: every draft layer attends to the last W context positions only (and to the whole
  block: a bidirectional ``sliding_attention`` layer). The recipe's training contexts are shorter than 256
  tokens (prompt + 128 written), so training is the same as with full attention; served after a long prompt,
  the drafter sees a context like the ones it learned on instead of thousands of rows it never saw. On the
  SmolLM2 pair, greedy acceptance at S = 4096 was 1.08 with full attention, 1.49 with W = 256 (1.40 at S =
  128 either way; docs/benchmarks.md, "Long contexts"). ``None``: full attention (DeepSeek's default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import DSparkConfig
from ..errors import DSparkTrtError

__all__ = ["DrafterShape", "drafter_config", "init_drafter", "shape_of", "shape_mismatches", "context_window_of"]


@dataclass(frozen=True)
class DrafterShape:
    num_layers: int = 1
    target_layer_ids: tuple[int, ...] | None = None  # default: spread_taps(num_target_layers)
    markov_rank: int = 64
    markov_head_type: str = "vanilla"  # vanilla | gated | rnn
    block_size: int = 7
    draft_vocab_size: int | None = None  # default: the full vocabulary
    mask_token_id: int | None = None  # default: a special token the target never writes, else V - 1
    context_window: int | None = 256  # W: the context rows each draft layer reads (None: all of them)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.context_window is not None and self.context_window < 1:
            raise DSparkTrtError(f"context window {self.context_window}: use W >= 1 context rows, or None (0 on the "
                                 f"command line) for all")


def spread_taps(num_target_layers: int) -> tuple[int, ...]:
    """Three DeepSeek layer ids: about 1/10, 1/2 and the layer before last."""
    last = num_target_layers - 2
    return tuple(sorted({max(1, num_target_layers // 10), num_target_layers // 2, last}))


def shape_of(config: DSparkConfig) -> DrafterShape:
    """The ``DrafterShape`` of an existing drafter (``distill --init-from`` keeps it)."""
    return DrafterShape(num_layers=config.num_hidden_layers, target_layer_ids=tuple(config.target_layer_ids),
                        markov_rank=config.markov_rank, markov_head_type=config.markov_head_type,
                        block_size=config.block_size,
                        draft_vocab_size=config.draft_vocab_size if config.has_reduced_vocab else None,
                        mask_token_id=config.mask_token_id, context_window=context_window_of(config))


def context_window_of(config: DSparkConfig) -> int | None:
    """W when every draft layer is a bidirectional sliding-window layer of window W (the recipe's pattern), None
    when every layer attends fully; any other pattern is not the recipe's."""
    patterns = {config.layer_attention(i) for i in range(config.num_hidden_layers)}
    if len(patterns) == 1:
        (window, causal), = patterns
        if not causal:
            return window  # None: every layer attends fully
    raise DSparkTrtError(f"draft layers {list(config.layer_types)} (window {config.sliding_window}, causal "
                         f"{not config.sliding_window_non_causal}) are not the recipe's pattern (all full, or all "
                         f"bidirectional with one window); train from a drafter of the recipe's pattern")


SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "target_layer_ids", "markov_rank", "markov_head_type", "block_size",
                "draft_vocab_size", "mask_token_id")


def shape_mismatches(a: DSparkConfig, b: DSparkConfig) -> list[str]:
    """``field a≠b`` for every field that fixes a tensor shape or the block layout and differs."""
    def value(c: DSparkConfig, f: str):
        v = getattr(c, f)
        return tuple(v) if isinstance(v, (list, tuple)) else v

    return [f"{f} {value(a, f)}≠{value(b, f)}" for f in SHAPE_FIELDS if value(a, f) != value(b, f)]


def drafter_config(target_config: dict, shape: DrafterShape) -> DSparkConfig:
    L = int(target_config["num_hidden_layers"])
    V = int(target_config["vocab_size"])
    heads = int(target_config["num_attention_heads"])
    d = int(target_config["hidden_size"])
    rope = target_config.get("rope_parameters") or {}
    W = shape.context_window
    window = {} if W is None else dict(layer_types=("sliding_attention",) * shape.num_layers, sliding_window=int(W),
                                       sliding_window_non_causal=True)
    return DSparkConfig(
        vocab_size=V,
        draft_vocab_size=shape.draft_vocab_size or V,
        hidden_size=d,
        intermediate_size=int(target_config["intermediate_size"]),
        num_hidden_layers=shape.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(target_config.get("num_key_value_heads") or heads),
        head_dim=int(target_config.get("head_dim") or d // heads),
        rms_norm_eps=float(target_config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", target_config.get("rope_theta", 10000.0))),
        block_size=shape.block_size,
        mask_token_id=V - 1 if shape.mask_token_id is None else shape.mask_token_id,
        target_layer_ids=tuple(shape.target_layer_ids or spread_taps(L)),
        num_target_layers=L,
        markov_rank=shape.markov_rank,
        markov_head_type=shape.markov_head_type,  # type: ignore[arg-type]  (DSparkConfig checks it)
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        logit_scale=1.0,
        sample_from_anchor=True,
        **window,
    )


@torch.no_grad()
def _init_head_projection(head, d: int, gen: torch.Generator) -> None:
    """A gated / RNN head's projection, starting as the vanilla head (module docstring); nothing for vanilla."""
    proj = head.projection
    if proj is None:
        return
    r = head.markov_w1.weight.shape[1]
    w = 0.01 * torch.randn(proj.weight.shape, generator=gen)
    if head.head_type == "gated":  # inputs [h ; e]
        w[:, :d] = 0.0
    else:  # inputs [s ; e ; h], outputs [γ ; c ; o]
        w[:, 2 * r:] = 0.0
        w[2 * r:, r:2 * r] += torch.eye(r)
    proj.weight.copy_(w)
    proj.bias.zero_()


@torch.no_grad()
def init_drafter(config: DSparkConfig, target_model, draft_ids: torch.Tensor, *, seed: int):
    """A reference ``DSparkDrafter`` (fp32) for ``target_model``: shared embeddings/head copied (head rows
    ``draft_ids`` [V_d] target ids), layers from the target's last layers, small random Markov/confidence."""
    from ..reference.drafter import DSparkDrafter

    gen = torch.Generator().manual_seed(seed)
    drafter = DSparkDrafter(config).to(torch.float32)
    c = config
    drafter.embed_tokens.weight.copy_(target_model.get_input_embeddings().weight.to(torch.float32))
    drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight[draft_ids].to(torch.float32))
    drafter.d2t.copy_(draft_ids - torch.arange(c.draft_vocab_size))
    d = c.hidden_size
    fc = 0.01 * torch.randn(d, c.num_taps * d, generator=gen)
    fc[:, (c.num_taps - 1) * d:] += torch.eye(d)
    drafter.fc.weight.copy_(fc)
    inner = getattr(target_model, "model", target_model)
    layers = list(getattr(inner, "layers", []))
    for i, layer in enumerate(drafter.layers):
        src = layers[len(layers) - c.num_hidden_layers + i].state_dict() if layers else {}
        for name, p in layer.named_parameters():
            if name in src and src[name].shape == p.shape:
                p.copy_(src[name].to(torch.float32))
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    norm = getattr(inner, "norm", None)
    if norm is not None and norm.weight.shape == drafter.norm.weight.shape:
        drafter.norm.weight.copy_(norm.weight.to(torch.float32))
    drafter.markov_head.markov_w1.weight.copy_(0.01 * torch.randn(drafter.markov_head.markov_w1.weight.shape,
                                                                   generator=gen))
    drafter.markov_head.markov_w2.weight.zero_()  # starts as no bias; trained
    _init_head_projection(drafter.markov_head, d, gen)
    if drafter.confidence_head is not None:
        drafter.confidence_head.proj.weight.zero_()
        drafter.confidence_head.proj.bias.zero_()
    return drafter
