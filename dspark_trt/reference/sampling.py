"""Counter-based noise keyed by (seed, position, token id, stream salt), and temperature handling.

Every executor — this reference, the Triton kernel, the ONNX local function, TensorRT — must draw the
*same* uniforms, so the hash is exact integer arithmetic that all of them have: int64 multiply, add,
floor-division and modulo on non-negative values, never overflowing (products < 2^62).

    P = 2^31 - 1                                  (Mersenne prime)
    round(x, a) = rot16((x · a) mod P)            x ∈ [0, P), a < 2^31
    rot16(y)    = (y mod 2^16) · 2^15 + ⌊y / 2^16⌋  (a 31-bit rotation; bijective on [0, 2^31 - 1))
    mix(x)      = round(round(x, A1), A2)
    h           = mix((mix((mix((seed + salt) mod P) + position) mod P) + token) mod P)
    u           = (⌊h / 2^8⌋ + 1/2) · 2^-23        ∈ (0, 1), exact in fp32

The multiply mod a prime is non-linear with respect to the rotation, so neighbouring tokens and positions
get unrelated uniforms (tested by chi-square in ``tests/reference/test_sampling.py``). Gumbel-max turns them
into samples: ``argmax_v (z_v / T + g_v)``, ``g = -log(-log u)``.

Streams (salts) keep the draft's noise disjoint from the verifier's (spec §8.3.3, vLLM #54282):
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
    "uniform_noise",
    "gumbel_noise",
    "is_greedy",
]

HASH_PRIME = 2147483647  # 2^31 - 1
HASH_MULT_1 = 950706376  # multipliers of full period mod 2^31 - 1 (Fishman & Moore)
HASH_MULT_2 = 742938285
DRAFT_SALT = 1 << 30  # as vLLM's draft salt `pos + (1 << 30)`: a stream the verifier never uses
ACCEPT_SALT = 0x2545F491
SAMPLE_SALT = 0x1B873593
GREEDY_TEMPERATURE = 1e-5  # temperatures below this draft and verify greedily (DeepSpec's threshold)


def _round(x: torch.Tensor, mult: int) -> torch.Tensor:
    x = (x * mult) % HASH_PRIME  # < 2^62: no int64 overflow
    return (x % 65536) * 32768 + x // 65536  # rotate the 31-bit value by 16


def _mix(x: torch.Tensor) -> torch.Tensor:
    return _round(_round(x, HASH_MULT_1), HASH_MULT_2)


def noise_hash(seed: torch.Tensor, position: torch.Tensor, token: torch.Tensor, salt: int) -> torch.Tensor:
    """31-bit hash of (seed, position, token) in stream ``salt``; broadcasts; all inputs non-negative int."""
    seed, position, token = (t.to(torch.int64) for t in (seed, position, token))
    h = _mix((seed % HASH_PRIME + salt) % HASH_PRIME)
    h = _mix((h + position % HASH_PRIME) % HASH_PRIME)
    return _mix((h + token % HASH_PRIME) % HASH_PRIME)


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
