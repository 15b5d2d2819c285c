"""The causal-LM loss without the logits: lm_head and cross-entropy fused, chunk by chunk.

A transformers causal LM computes `logits = lm_head(hidden)` for every token (tokens x vocab: a
16 x 2048-token micro-batch with a 32k vocabulary is 1G values, 2 GB in bf16), keeps them for the
backward pass, returns them (Accelerate's mixed precision converts them to fp32 on the way out:
4 GB more), and reads them again for the loss. `fuse_lm_loss` makes the model return the hidden
states instead and computes the loss, and its gradients, chunk by chunk over the tokens: each
chunk's logits (in fp32 from a bf16 product under autocast, as transformers' own loss upcasts
them) live only while their loss and gradient are computed, in the forward pass; the backward pass
scales the stored gradients by the incoming one. The matrix products are the usual three
(logits, grad of the hidden states, grad of the weight); the loss is the same sum over labels
divided by `num_items_in_batch` (or the label count) as transformers' `ForCausalLMLoss`.

Only for models whose logits are `lm_head(hidden)` and nothing more (`FUSABLE`); the fused model's
`.logits` are the final hidden states, so it is for training and loss evaluation only.

Measured on one H100 (docs/performance.md's 1.1B Llama, micro batch 16 x 2048, compiled; benchmarks/train_mfu.py):
peak memory 65.9 -> 61.8 GiB, tokens/s +0.2% (inductor already fused most of the old loss).
"""

from __future__ import annotations

from functools import partial

import torch

IGNORE = -100
# Model types whose causal-LM head is exactly logits = lm_head(hidden) (no soft-capping, scaling or bias).
FUSABLE = {"llama", "mistral", "qwen2", "qwen3"}
CHUNK_TOKENS = 4096


class HiddenHead(torch.nn.Linear):
    """An lm_head that returns its input: the fused loss applies its weight chunk by chunk."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def fuse_lm_loss(model, chunk_tokens: int = CHUNK_TOKENS) -> bool:
    """Make `model` (a transformers causal LM) compute its loss with `linear_cross_entropy` and
    return its hidden states as logits; False (nothing changed) for a model it does not fit."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if (
        getattr(model.config, "model_type", None) not in FUSABLE
        or type(head) is not torch.nn.Linear
        or head.bias is not None
    ):
        return False
    head.__class__ = HiddenHead  # same parameters and state dict names: checkpoints do not change
    model.loss_function = partial(causal_lm_loss, head)
    return True


def causal_lm_loss(
    head: torch.nn.Linear,
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = IGNORE,
    shift_labels: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """transformers' ForCausalLMLoss, with `logits` the hidden states (the head not yet applied)."""
    hidden = logits
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    hidden = hidden.reshape(-1, hidden.shape[-1])
    target = shift_labels.reshape(-1).to(hidden.device)
    if ignore_index != IGNORE:
        target = torch.where(target == ignore_index, IGNORE, target)
    total = linear_cross_entropy(hidden, head.weight, target)
    if num_items_in_batch is None:
        return total / (target != IGNORE).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, chunk: int = CHUNK_TOKENS
) -> torch.Tensor:
    """Sum over the tokens whose target is not -100 of cross_entropy(hidden @ weight.T, target),
    in fp32, without holding more than `chunk` tokens' logits; the products in the autocast dtype."""
    dtype = _compute_dtype(hidden)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, target, chunk, dtype)
    h, w = hidden.to(dtype), weight.to(dtype)
    acc = torch.promote_types(dtype, torch.float32)
    total = torch.zeros((), dtype=acc, device=hidden.device)
    for s in range(0, h.shape[0], chunk):
        logits = (h[s : s + chunk] @ w.t()).to(acc)
        y = target[s : s + chunk]
        valid = y != IGNORE
        picked = logits.gather(1, torch.where(valid, y, 0).unsqueeze(1)).squeeze(1)
        total = total + torch.where(valid, torch.logsumexp(logits, dim=-1) - picked, 0.0).sum()
    return total


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss and both gradients in the forward pass, chunk by chunk (the loss is a final scalar:
    the backward pass only scales them)."""

    @staticmethod
    def forward(ctx, hidden, weight, target, chunk, dtype):
        h, w = hidden.to(dtype), weight.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
        total = torch.zeros((), dtype=acc, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=acc)
        for s in range(0, h.shape[0], chunk):
            hc, y = h[s : s + chunk], target[s : s + chunk]
            logits = (hc @ w.t()).to(acc)
            valid = y != IGNORE
            index = torch.where(valid, y, 0).unsqueeze(1)
            lse = torch.logsumexp(logits, dim=-1)
            total = total + torch.where(valid, lse - logits.gather(1, index).squeeze(1), 0.0).sum()
            # d loss / d logits = softmax - one_hot(target), zero for ignored tokens
            grad = (logits - lse.unsqueeze(1)).exp()
            grad = grad.scatter_add(1, index, torch.full_like(lse, -1.0).unsqueeze(1))
            grad = (grad * valid.unsqueeze(1)).to(dtype)
            grad_hidden[s : s + chunk] = (grad @ w).to(hidden.dtype)
            grad_weight += (grad.t() @ hc).to(acc)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            grad_hidden * grad_total.to(grad_hidden.dtype),
            grad_weight * grad_total.to(grad_weight.dtype),
            None,
            None,
            None,
        )
