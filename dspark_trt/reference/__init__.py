"""The oracle: pure-PyTorch DSpark drafter, Markov walk, noise and verifier. Imports torch only."""

from .drafter import ConfidenceHead, DSparkDrafter, MarkovHead
from .markov import MarkovWalkResult, draft_to_target, markov_walk
from .sampling import gumbel_noise, noise_hash, uniform_noise
from .verify import VerifyResult, draft_probs, sample_tokens, verify_drafts

__all__ = [
    "ConfidenceHead",
    "DSparkDrafter",
    "MarkovHead",
    "MarkovWalkResult",
    "VerifyResult",
    "draft_probs",
    "draft_to_target",
    "gumbel_noise",
    "markov_walk",
    "noise_hash",
    "sample_tokens",
    "uniform_noise",
    "verify_drafts",
]
