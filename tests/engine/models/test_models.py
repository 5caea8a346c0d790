"""Our model stacks against transformers on the same (tiny, random) weights, and batch invariance.

Streams are laid out as the packer lays them: each sequence a linear-chain tree in its own
span starting at a multiple of ROW_CHUNK, pads (token 0) seeing only themselves, and each
span's scored rows padded to a multiple of SCORE_CHUNK.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from engine.layers.attention import AttentionMetadata, TreeSpan
from engine.layers.ops import ROW_CHUNK, SCORE_CHUNK
from engine.loading.loader import load_model
from engine.models import build_model
from engine.testing.tiny import TINY_FAMILIES, TINY_SLIDING_WINDOW

ATOL = 1e-4  # fp32, logits spread over ~8 units


@dataclass
class Packed:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionMetadata
    scored_index: torch.Tensor  # [S]
    rows: list[slice]  # per sequence: its rows of the returned logits

    def run(self, model) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, self.positions, self.attn, self.scored_index)


def pack(sequences: list[torch.Tensor], num_scored: int | None = None) -> Packed:
    """Score every position of each sequence, or only its last `num_scored` (the LM head over
    a 262k vocabulary is most of a tiny model's time)."""
    ids, positions, spans, scored, rows = [], [], [], [], []
    start = total_scored = 0
    for seq in sequences:
        n = len(seq)
        padded = -(-n // ROW_CHUNK) * ROW_CHUNK
        mask = torch.eye(padded, dtype=torch.bool)  # pads see themselves
        mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        pos = torch.zeros(padded, dtype=torch.long)
        pos[:n] = torch.arange(n)
        spans.append(TreeSpan(start=start, mask=mask, positions=pos))
        ids.append(torch.cat([seq, torch.zeros(padded - n, dtype=torch.long)]))
        positions.append(pos)
        first = 0 if num_scored is None else n - num_scored
        num_padded_scored = -(-(n - first) // SCORE_CHUNK) * SCORE_CHUNK
        pad_scored = torch.full((num_padded_scored - (n - first),), n - 1)
        scored.append(start + torch.cat([torch.arange(first, n), pad_scored]))
        rows.append(slice(total_scored, total_scored + n - first))
        start += padded
        total_scored += num_padded_scored
    return Packed(torch.cat(ids), torch.cat(positions), AttentionMetadata(spans), torch.cat(scored), rows)


@pytest.fixture(scope="module")
def models(tiny_checkpoint):
    """models(family) -> (ours, transformers') on the same tiny fp32 checkpoint."""
    from transformers import AutoModelForCausalLM

    made = {}

    def get(family: str):
        if family not in made:
            path = tiny_checkpoint(family)
            ours = load_model(path, torch.float32, "cpu")
            theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            made[family] = (ours, theirs)
        return made[family]

    return get


def reference_logits(hf_model, seq: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(seq[None]).logits[0].float()  # [n, V], every position


def random_tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(1, 30_000, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_single_sequence_matches_transformers(models, family):
    ours, theirs = models(family)
    seq = random_tokens(45, seed=1)
    packed = pack([seq])
    logits = packed.run(ours)
    assert logits.dtype == torch.float32 and logits.shape == (48, theirs.config.vocab_size)
    want = reference_logits(theirs, seq)
    assert want.std() > 1.0  # random weights spread enough that a wrong model shows
    torch.testing.assert_close(logits[packed.rows[0]], want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_packed_sequences_each_match_their_own_run(models, family):
    ours, theirs = models(family)
    first, second = random_tokens(37, seed=2), random_tokens(70, seed=3)
    packed = pack([first, second])
    assert [s.start for s in packed.attn.spans] == [0, 64]
    logits = packed.run(ours)
    torch.testing.assert_close(logits[packed.rows[0]], reference_logits(theirs, first), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[packed.rows[1]], reference_logits(theirs, second), atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3"])
def test_sequence_longer_than_sliding_window(models, family):
    ours, theirs = models(family)
    seq = random_tokens(150, seed=4)
    assert len(seq) > 4 * TINY_SLIDING_WINDOW
    num_scored = 40  # positions 110..149: far past the window
    packed = pack([seq], num_scored=num_scored)
    logits = packed.run(ours)
    want = reference_logits(theirs, seq)[-num_scored:]
    torch.testing.assert_close(logits[packed.rows[0]], want, atol=ATOL, rtol=0)

    # the window must matter, or this test could not catch a missing one
    sliding = [layer.self_attn for layer in ours.model.layers if layer.self_attn.sliding_window]
    assert sliding and all(a.sliding_window == TINY_SLIDING_WINDOW for a in sliding)
    try:
        for attn in sliding:
            attn.sliding_window = None
        unwindowed = packed.run(ours)
    finally:
        for attn in sliding:
            attn.sliding_window = TINY_SLIDING_WINDOW
    assert not torch.allclose(unwindowed[packed.rows[0]], logits[packed.rows[0]], atol=1e-2)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_batch_invariance_alone_vs_packed(models, family):
    ours, _ = models(family)
    target, other = random_tokens(50, seed=5), random_tokens(100, seed=6)
    alone = pack([target], num_scored=24)
    alone_logits = alone.run(ours)[alone.rows[0]]
    after = pack([other, target], num_scored=24)
    assert torch.equal(after.run(ours)[after.rows[1]], alone_logits)
    before = pack([target, other], num_scored=24)
    assert torch.equal(before.run(ours)[before.rows[0]], alone_logits)


def test_bf16_stays_close_to_fp32(tiny_checkpoint):
    path = tiny_checkpoint("qwen2")
    fp32 = load_model(path, torch.float32, "cpu")
    bf16 = load_model(path, torch.bfloat16, "cpu")
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    packed = pack([random_tokens(30, seed=7)])
    full, half = packed.run(fp32), packed.run(bf16)
    assert half.dtype == torch.float32
    assert (full.argmax(-1) == half.argmax(-1)).float().mean() > 0.9
    assert (full - half).abs().max() < 1.0


def test_scored_rows_must_be_a_multiple_of_score_chunk(models):
    ours, _ = models("llama")
    packed = pack([random_tokens(20, seed=8)])
    with pytest.raises(ValueError, match="SCORE_CHUNK"):
        ours(packed.input_ids, packed.positions, packed.attn, packed.scored_index[:5])


def test_build_model_rejects_unknown_model_type():
    from transformers import AutoConfig

    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'.*llama, qwen2, qwen3, gemma3_text"):
        build_model(AutoConfig.for_model("gpt2"))


def test_build_model_on_meta_device_then_load(models, tiny_checkpoint):
    """benchmarks build on the meta device and load by assignment: the RoPE tables must
    still be real numbers."""
    from safetensors.torch import load_file

    ours, theirs = models("gemma3_text")
    with torch.device("meta"):
        model = build_model(theirs.config)
    model.load_checkpoint_state(load_file(tiny_checkpoint("gemma3_text") / "model.safetensors"))
    packed = pack([random_tokens(20, seed=9)])
    assert torch.equal(packed.run(model), packed.run(ours))


def test_tiny_checkpoints_are_deterministic_for_a_seed(tiny_checkpoint, tmp_path):
    from engine.loading.loader import sha256_file
    from engine.testing.tiny import make_tiny_checkpoint

    again = make_tiny_checkpoint("llama", tmp_path / "again", seed=0)
    other = make_tiny_checkpoint("llama", tmp_path / "other", seed=1)
    digest = sha256_file(tiny_checkpoint("llama") / "model.safetensors")
    assert sha256_file(again / "model.safetensors") == digest
    assert sha256_file(other / "model.safetensors") != digest


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_loading_fuses_the_projections(models, tiny_checkpoint, family):
    """HF names load strictly; after loading q/k/v and gate/up are one weight each (their rows
    side by side) and the unfused ones are gone."""
    from safetensors.torch import load_file

    ours, _ = models(family)
    state = load_file(tiny_checkpoint(family) / "model.safetensors")
    attn, mlp = ours.model.layers[1].self_attn, ours.model.layers[1].mlp
    assert not any(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj"))
    assert not any(hasattr(mlp, n) for n in ("gate_proj", "up_proj"))
    prefix = "model.layers.1."
    qkv = [state[f"{prefix}self_attn.{n}_proj.weight"] for n in "qkv"]
    assert torch.equal(attn.qkv_proj.weight, torch.cat(qkv))
    assert torch.equal(mlp.gate_up_proj.weight, torch.cat([state[f"{prefix}mlp.{n}_proj.weight"] for n in ("gate", "up")]))
    if f"{prefix}self_attn.q_proj.bias" in state:  # qwen2
        assert torch.equal(attn.qkv_proj.bias, torch.cat([state[f"{prefix}self_attn.{n}_proj.bias"] for n in "qkv"]))
    assert not any(".q_proj." in n or ".up_proj." in n for n in ours.state_dict())


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_padded_flex_path_matches_per_span_attention(models, family):
    """The packed CUDA path, run on CPU (flex eagerly): with a block mask the q/k/v matmul
    writes into the pass's [Tp, N] buffer (tail rows zero), q/k are normed into Tp rows, and
    flex attention pads nothing that comes padded."""
    import dataclasses

    from engine.layers.attention_cuda import build_tree_block_masks

    ours, _ = models(family)
    packed = pack([random_tokens(40, seed=3), random_tokens(90, seed=4)], num_scored=8)
    masks = build_tree_block_masks(packed.attn.spans, torch.device("cpu"), bucket=256)
    with torch.no_grad():
        got = ours(packed.input_ids, packed.positions, dataclasses.replace(packed.attn, block_mask=masks), packed.scored_index)
    torch.testing.assert_close(got, packed.run(ours), atol=ATOL, rtol=0)
    (buffer,) = masks._padded_buffers.values()
    assert buffer.shape[0] == 256 and not buffer[masks.num_tokens :].any()
