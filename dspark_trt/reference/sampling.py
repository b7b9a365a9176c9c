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
