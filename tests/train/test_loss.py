"""moai.train.loss: the fused lm_head + cross-entropy gives transformers' loss and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from moai.train.loss import HiddenHead, fuse_lm_loss, linear_cross_entropy


def tiny(model_type: str = "llama", attn: str = "sdpa", **extra):
    cfg = AutoConfig.for_model(
        model_type,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=128,
        **extra,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (3, 40), generator=g)
    labels = ids.clone()
    labels[0, :10] = -100  # a prompt
    labels[2, 5:9] = -100
    pos = torch.cat([torch.arange(25), torch.arange(15)]).expand(3, 40)  # two documents a row
    return {"input_ids": ids, "labels": labels, "position_ids": pos}


@pytest.mark.parametrize("items", [None, torch.tensor(77.0)])
def test_fused_loss_and_gradients_equal_transformers(items):
    ref = tiny()
    fused = copy.deepcopy(ref)
    assert fuse_lm_loss(fused, chunk_tokens=7)  # chunks that cut rows and do not divide the tokens
    import moai.train.loss as loss_module

    chunk = loss_module.CHUNK_TOKENS
    loss_module.CHUNK_TOKENS = 7
    try:
        a = ref(**batch(), num_items_in_batch=items).loss
        b = fused(**batch(), num_items_in_batch=items).loss
        a.backward()
        b.backward()
    finally:
        loss_module.CHUNK_TOKENS = chunk
    assert abs(a.item() - b.item()) < 1e-5 * abs(a.item())
    for (name, p), q in zip(ref.named_parameters(), fused.parameters(), strict=True):
        assert (p.grad - q.grad).norm() <= 1e-5 * p.grad.norm() + 1e-9, name
    # checkpoints do not change: same names, and the head keeps its weight
    assert list(ref.state_dict()) == list(fused.state_dict())
    assert isinstance(fused.get_output_embeddings(), HiddenHead)


def test_fused_loss_without_gradients_and_in_bf16():
    ref = tiny()
    fused = copy.deepcopy(ref)
    fuse_lm_loss(fused)
    with torch.no_grad():
        assert fused(**batch()).loss.item() == pytest.approx(ref(**batch()).loss.item(), rel=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused(**batch()).loss.item() == pytest.approx(ref(**batch()).loss.item(), rel=1e-2)


def test_linear_cross_entropy_sums_labelled_tokens():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(10, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(20, 8, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3, -100, 5, 0, 19, -100, 7, 7, 1, 2])
    got = linear_cross_entropy(h, w, y, chunk=3)
    want = torch.nn.functional.cross_entropy(h @ w.t(), y, ignore_index=-100, reduction="sum")
    assert torch.allclose(got, want)
    (gh, gw) = torch.autograd.grad(got * 2.5, (h, w))
    (wh, ww) = torch.autograd.grad(want * 2.5, (h, w))
    assert torch.allclose(gh, wh) and torch.allclose(gw, ww)


def test_a_model_with_another_head_is_left_alone():
    model = tiny("gemma2", "eager", head_dim=16)  # soft-capped logits: lm_head(hidden) is not the whole head
    assert not fuse_lm_loss(model)
    assert type(model.get_output_embeddings()) is torch.nn.Linear


def test_fused_model_compiles_without_graph_breaks():
    from torch._dynamo.utils import counters

    model = tiny()
    fuse_lm_loss(model)
    torch._dynamo.reset()
    counters.clear()
    loss = torch.compile(model, backend="aot_eager")(**batch()).loss
    loss.backward()
    assert not counters["graph_break"]
    assert model.get_output_embeddings().weight.grad is not None
