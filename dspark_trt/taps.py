"""Which target hidden states feed the drafter, taken from a ``transformers`` causal LM (one place for both
``HFTarget`` and the exported target graph, ``export/target_graph.py``).

Layer ids are the DeepSeek convention (id i = output of decoder layer i, -1 = the embeddings), converted to
``output_hidden_states`` indices with ``config.hf_hidden_state_indices`` here and nowhere else. The last
decoder layer (id L-1, speculators' ``--include-last-layer``) is tapped *before* the final norm — what vLLM
captures — which ``output_hidden_states[-1]`` is not (transformers replaces it with the normed output), so
``LayerTaps.capture`` records that layer's output with a forward hook.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from .config import check_layer_ids, hf_hidden_state_indices
from .errors import DSparkTrtError

__all__ = ["LayerTaps", "decoder_layers", "check_layer_ids"]


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of a causal LM (``model.model.layers`` for Llama/Qwen, via ``get_decoder``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise DSparkTrtError(f"cannot find the decoder layers of {type(model).__name__}; targets must be "
                             f"transformers causal LMs with model.layers (Llama, Qwen2, Qwen3, ...)")
    return layers


class LayerTaps:
    """Concatenate the tapped hidden states ``[B, Q, m·d]`` in ``target_layer_ids`` order.

    Example:
        >>> taps = LayerTaps([1, 2, 5], num_layers=6)
        >>> with taps.capture(model):
        ...     out = model(ids, output_hidden_states=True)
        >>> features = taps.select(out.hidden_states)            # [B, Q, 3·d]
    """

    def __init__(self, target_layer_ids: Sequence[int], num_layers: int):
        self.layer_ids = tuple(int(i) for i in target_layer_ids)
        check_layer_ids(self.layer_ids, num_layers)
        self.num_layers = num_layers
        self.indices = hf_hidden_state_indices(self.layer_ids)  # output_hidden_states indices
        self.taps_last_layer = num_layers in self.indices  # index L: pre-norm capture, not hidden_states[L]
        self._last: torch.Tensor | None = None

    @contextlib.contextmanager
    def capture(self, model):
        """Record the last decoder layer's output (before the final norm) while the block runs."""
        if not self.taps_last_layer:
            yield
            return

        def hook(_module, _args, output):
            self._last = output[0] if isinstance(output, (tuple, list)) else output

        handle = decoder_layers(model)[self.num_layers - 1].register_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    def select_states(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """Taps from the embeddings and every decoder layer's own output (L+1 tensors [B, Q, d], the last one
        before the final norm: what a caller looping over the layers holds) → [B, Q, m·d]."""
        if len(states) != self.num_layers + 1:
            raise DSparkTrtError(f"expected the embeddings and {self.num_layers} layer outputs, got {len(states)}")
        return torch.cat([states[i] for i in self.indices], dim=-1)

    def select(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """``output_hidden_states`` (L+1 tensors [B, Q, d]) → taps [B, Q, m·d]; the captured pre-norm for id L-1."""
        parts = []
        for i in self.indices:
            if i == self.num_layers:
                if self._last is None:
                    raise DSparkTrtError("the last target layer is tapped but was not captured; run the model "
                                         "inside LayerTaps.capture(model)")
                parts.append(self._last)
            else:
                parts.append(hidden_states[i])
        self._last = None
        return torch.cat(parts, dim=-1)
