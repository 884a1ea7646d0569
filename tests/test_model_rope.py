"""Each model preset's rotary embedding is its own config.json's, and the decoder layer and the
rope + store capture rotate with it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kvprof.capture.config import CaptureConfig
from kvprof.capture.layout_session import session_for
from kvprof.capture.plan import resolve
from kvprof.capture.rope_session import RopeSession
from kvprof.kvcache.layer import DecoderContext, Rotary, cos_sin_cache, inv_freq
from kvprof.kvcache.models import LLAMA31_ROPE, PRESETS, RankShape, RopeSpec, resolve_model
from kvprof.kvcache.writers import create_writer
from kvprof.kvcache.writers.rope_reference import rope_reference

CPU = torch.device("cpu")

# (rope_theta, rope_scaling.rope_type, its factor, max_position_embeddings), from each config.json;
# every preset rotates whole heads (no partial_rotary_factor) with GPT-NeoX halves (rotate_half)
CONFIGS = {
    "llama-3.1-8b": (500000.0, "llama3", 8.0, 131072),
    "llama-3.1-70b": (500000.0, "llama3", 8.0, 131072),
    "llama-3.1-405b": (500000.0, "llama3", 8.0, 131072),
    "llama-3.2-1b": (500000.0, "llama3", 32.0, 131072),
    "qwen2.5-7b": (1000000.0, "default", 1.0, 131072),
    "qwen2.5-72b": (1000000.0, "default", 1.0, 131072),
    "mixtral-8x7b": (1000000.0, "default", 1.0, 32768),
}


def test_every_preset_carries_its_models_rope():
    assert set(CONFIGS) == set(PRESETS)
    for name, (theta, rope_type, factor, max_position) in CONFIGS.items():
        rope = PRESETS[name].rope
        assert (rope.theta, rope.rope_type, rope.factor, rope.max_position) == (theta, rope_type, factor,
                                                                                 max_position), name
        assert rope.partial_rotary == 1.0 and rope.is_neox, name
        shape = resolve_model(name).per_rank(8)
        assert shape.rope is rope and "rope" not in shape.as_dict()  # the pool's shape stays the pool's
    assert resolve_model("mine=4x2x64").rope is LLAMA31_ROPE  # no preset: Llama-3.1's, as before


def test_the_frequencies_follow_the_rope_type():
    dims = torch.arange(0, 128, 2, dtype=torch.float32) / 128
    qwen = inv_freq(PRESETS["qwen2.5-7b"].rope, 128)
    assert torch.equal(qwen, 1.0 / (1000000.0 ** dims))  # unscaled: theta's powers
    llama32 = inv_freq(PRESETS["llama-3.2-1b"].rope, 128)
    plain = 1.0 / (500000.0 ** dims)
    # llama3 scaling: the highest frequencies kept, the lowest divided by the factor (32 here, 8 for 3.1)
    assert llama32[0] == plain[0] and llama32[-1] == pytest.approx(plain[-1] / 32)
    assert inv_freq(LLAMA31_ROPE, 128)[-1] == pytest.approx(plain[-1] / 8)
    assert "factor" not in PRESETS["mixtral-8x7b"].rope.as_dict() and LLAMA31_ROPE.as_dict()["factor"] == 8.0
    with pytest.raises(ValueError, match="rope_type"):
        RopeSpec(rope_type="yarn")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_rotary_and_gptj_style_rotate_what_the_config_says(dtype):
    """Against kvprof.kvcache.writers.rope_reference; float32 q and k too (the torch rotary once
    overwrote the first half before the second half read it)."""
    spec = RopeSpec(theta=10000.0, partial_rotary=0.5, is_neox=False, max_position=64)
    assert spec.rotary_dim(128) == 64
    rotary = Rotary(128, CPU, spec, "torch")
    assert rotary.cos_sin_cache.shape == (64, 64) and rotary.is_neox is False
    q, k = torch.randn(3, 2, 128).to(dtype), torch.randn(3, 1, 128).to(dtype)
    positions = torch.tensor([1, 5, 9])
    rq, rk = rope_reference(q, k, rotary.cos_sin_cache, positions, False)
    q0 = q.clone()
    rotary(q, k, positions)
    assert torch.equal(q, rq.to(dtype)) and torch.equal(k, rk.to(dtype))
    assert torch.equal(q[..., 64:], q0[..., 64:]) and not torch.equal(q[..., :64], q0[..., :64])  # half rotated


def test_the_decoder_layer_rotates_with_the_models_rope():
    qwen = PRESETS["qwen2.5-7b"].rope
    shape = RankShape(model="tiny", tp=1, layers=1, head_num=1, head_dim=64, v_head_dim=64, hidden=128, q_head_num=2,
                      intermediate=64, rope=qwen)
    context = DecoderContext(shape, torch.float32, CPU, context_len=8)
    assert context.kernels.rope == qwen.as_dict() and context.kernels.rope["theta"] == 1000000.0
    assert torch.equal(context.rotary.cos_sin_cache, cos_sin_cache(qwen, 64, qwen.max_position))
    other = DecoderContext(replace(shape, rope=LLAMA31_ROPE), torch.float32, CPU, context_len=8)
    assert not torch.equal(other.rotary.cos_sin_cache[100], context.rotary.cos_sin_cache[100])


def test_the_rope_capture_rotates_with_the_models_rope():
    config = CaptureConfig(model="mixtral-8x7b", tp=8, variants=["rope_then_store"], phases=["decode"],
                           decode_sizes=[2], steps=1, warmup=0, device="cpu")
    with session_for(resolve(config, CPU), create_writer("rope_then_store"), CPU, instrument=False) as session:
        assert isinstance(session, RopeSession)
        prepared = session.prepare(session.phases[0], 0)
        rope = PRESETS["mixtral-8x7b"].rope
        assert torch.equal(prepared.cos_sin_cache, cos_sin_cache(rope, 128, session.max_position))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.2-1b"])
def test_the_cos_sin_cache_is_sglangs_for_the_model(name):
    """The same bits as SGLang's own rotary embedding class for the preset's rope_type."""
    rope = pytest.importorskip("sglang.srt.layers.rotary_embedding.rope_variant")
    spec = PRESETS[name].rope
    dim = PRESETS[name].head_dim
    # their constructors also pick a device kernel (vllm's on a CPU build); the cache is their own method
    cls = rope.RotaryEmbedding if spec.rope_type == "default" else rope.Llama3RotaryEmbedding
    theirs = cls.__new__(cls)
    torch.nn.Module.__init__(theirs)
    theirs.__dict__.update(rotary_dim=spec.rotary_dim(dim), max_position_embeddings=1024, base=spec.theta,
                           position_start=0, _force_native=False, scaling_factor=spec.factor,
                           low_freq_factor=spec.low_freq_factor, high_freq_factor=spec.high_freq_factor,
                           orig_max_position=spec.original_max_position)
    assert torch.equal(cos_sin_cache(spec, spec.rotary_dim(dim), 1024), theirs._compute_cos_sin_cache().float())
