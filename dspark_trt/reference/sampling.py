"""Counter-based noise keyed by (seed, position, token id, stream salt), and temperature handling.

Every executor — this reference, the Triton kernel, the ONNX local function, TensorRT — must draw the
*same* uniforms, so the hash is exact integer arithmetic that all of them have: int64 multiply, add and
modulo on non-negative values below 2^31, never overflowing (every product < 2^62).

    P        = 2^31 - 1                                        (Mersenne prime)
    round(x) = ((x² + c) mod P) · a mod P                      the square is the non-linear step
    mix(x)   = round₂(round₁(x))                               (a₁, c₁), (a₂, c₂) below
    prefix   = mix((mix((seed + salt) mod P) + position) mod P)   once per (request, step)
    h        = mix((prefix + token) mod P)                         once per candidate token
    u        = (⌊h / 2^8⌋ + 1/2) · 2^-23                        ∈ (0, 1), exact in fp32

(Purely linear steps — multiplying, adding, even rotating bits, which is multiplication by 2^k modulo a
Mersenne prime — would leave u an affine function of the token id; the squares make neighbouring tokens,
positions and seeds independent: see the chi-square tests in ``tests/reference/test_sampling.py``.)
Gumbel-max turns the uniforms into samples: ``argmax_v (z_v / T + g_v)``, ``g = -log(-log u)``.

Truncated sampling (``top_k``, ``top_p``, per request, on the distribution at temperature T as in
Hugging Face and vLLM): ``truncation_mask`` keeps the tokens whose scaled logit ``z = logit / T`` is at
least a threshold τ, so tied tokens are kept or dropped together::

    top-k:  τ_k = the k-th largest z                          (k = 0: off)
    top-p:  over softmax(z) restricted to z ≥ τ_k, in decreasing order, the shortest head whose mass
            reaches p; τ_p = the smallest z in it             (p = 1: off)
    keep    z ≥ max(τ_k, τ_p)                                  (the argmax is always kept)

The truncated distribution ``p' = softmax(z)`` over the kept tokens (0 elsewhere) is what the target-only
sampler draws from and what the verifier accepts against (``reference/verify.py``).

Streams (salts) keep the draft's noise disjoint from the verifier's (docs/dspark.md §8.3.3, vLLM #54282):
``DRAFT_SALT`` for the Markov walk's Gumbel noise, ``ACCEPT_SALT`` for the verifier's acceptance uniforms,
``SAMPLE_SALT`` for the verifier's residual/bonus samples and the target-only sampler.
"""

from __future__ import annotations

import torch

__all__ = [
    "HASH_PRIME",
    "DRAFT_SALT",
    "ACCEPT_SALT",
    "SAMPLE_SALT",
    "GREEDY_TEMPERATURE",
    "noise_hash",
    "noise_prefix",
    "uniform_noise",
    "gumbel_noise",
    "is_greedy",
    "truncation_mask",
    "apply_truncation",
]

HASH_PRIME = 2147483647  # 2^31 - 1
HASH_ROUNDS = ((950706376, 12345), (742938285, 67891))  # (a, c) per round
DRAFT_SALT = 1 << 30  # as vLLM's draft salt `pos + (1 << 30)`: a stream the verifier never uses
ACCEPT_SALT = 0x2545F491
SAMPLE_SALT = 0x1B873593
GREEDY_TEMPERATURE = 1e-5  # temperatures below this draft and verify greedily (DeepSpec's threshold)


def _mix(x: torch.Tensor) -> torch.Tensor:
    for mult, add in HASH_ROUNDS:
        x = (x * x + add) % HASH_PRIME  # x < 2^31: x² + c < 2^62
        x = (x * mult) % HASH_PRIME
    return x


def noise_prefix(seed: torch.Tensor, position: torch.Tensor, salt: int) -> torch.Tensor:
    """The (seed, position) part of the hash, int64 in [0, P); hoisted out of per-token loops by kernels."""
    seed, position = seed.to(torch.int64), position.to(torch.int64)
    h = _mix((seed % HASH_PRIME + salt) % HASH_PRIME)
    return _mix((h + position % HASH_PRIME) % HASH_PRIME)


def noise_hash(seed: torch.Tensor, position: torch.Tensor, token: torch.Tensor, salt: int) -> torch.Tensor:
    """31-bit hash of (seed, position, token) in stream ``salt``; broadcasts; all inputs non-negative int."""
    return _mix((noise_prefix(seed, position, salt) + token.to(torch.int64) % HASH_PRIME) % HASH_PRIME)


def uniform_noise(seed: torch.Tensor, position: torch.Tensor, token: torch.Tensor, salt: int) -> torch.Tensor:
    """Uniforms in (0, 1), fp32, keyed by (seed, position, token, salt); same shape as the broadcast inputs."""
    h = noise_hash(seed, position, token, salt)
    return ((h // 256).to(torch.float32) + 0.5) * (2.0**-23)


def gumbel_noise(seed: torch.Tensor, position: torch.Tensor, token: torch.Tensor, salt: int) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log u)`` in fp32 (finite: u never reaches 0 or 1)."""
    return -torch.log(-torch.log(uniform_noise(seed, position, token, salt)))


def is_greedy(temperature: torch.Tensor) -> torch.Tensor:
    """[B] bool: requests whose temperature means greedy (argmax) decoding."""
    return temperature.to(torch.float32) < GREEDY_TEMPERATURE


def truncation_mask(
    scaled: torch.Tensor,  # [..., V] fp32 logits / T
    top_k: torch.Tensor,  # [...] int64, 0 = off
    top_p: torch.Tensor,  # [...] fp32 in (0, 1], 1 = off
) -> torch.Tensor:
    """[..., V] bool: the tokens top-k / top-p keep (see the module docstring); every row keeps its argmax."""
    V = scaled.shape[-1]
    z = scaled.to(torch.float32)
    ordered = z.sort(-1, descending=True).values  # [..., V]
    k = torch.where(top_k > 0, top_k.clamp_max(V), V).to(torch.int64)  # [...]
    tau_k = ordered.gather(-1, (k - 1).unsqueeze(-1))  # [..., 1] the k-th largest
    head = torch.arange(V, device=z.device) < k.unsqueeze(-1)  # [..., V] the top-k of the sorted row
    probs = torch.softmax(torch.where(head, ordered, float("-inf")), -1)  # [..., V] renormalised top-k
    before = probs.cumsum(-1) - probs  # [..., V] mass of the tokens ahead of each
    count = (before < top_p.to(torch.float32).unsqueeze(-1)).sum(-1, keepdim=True).clamp(1, V)  # [..., 1]
    tau_p = ordered.gather(-1, count - 1)  # [..., 1] the smallest z of the top-p head
    tau = torch.where((top_p >= 1.0).unsqueeze(-1), tau_k, torch.maximum(tau_k, tau_p))
    return z >= tau


def apply_truncation(
    scaled: torch.Tensor,  # [..., V] fp32 logits / T
    top_k: torch.Tensor | None,  # [...] int64, 0 = off; None = all off
    top_p: torch.Tensor | None,  # [...] fp32, 1 = off; None = all off
) -> torch.Tensor:
    """``scaled`` with the tokens top-k / top-p drop set to −inf (only rows that truncate are touched)."""
    if top_k is None and top_p is None:
        return scaled
    lead = scaled.shape[:-1]
    top_k = torch.zeros(lead, dtype=torch.int64, device=scaled.device) if top_k is None else top_k.expand(lead)
    top_p = torch.ones(lead, dtype=torch.float32, device=scaled.device) if top_p is None else top_p.expand(lead)
    rows = (top_k > 0) | (top_p < 1.0)  # [...]
    if not bool(rows.any()):
        return scaled
    out = scaled.clone()
    sub = out[rows]  # [R, V]
    out[rows] = torch.where(truncation_mask(sub, top_k[rows], top_p[rows]), sub, float("-inf"))
    return out
