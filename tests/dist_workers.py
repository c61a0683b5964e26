"""Functions run on spawned ranks by the tests; each writes what it measured to a JSON file in ``out_dir``."""

import gc
import json
import math
from pathlib import Path

import torch

from vime_ext.models.model_config import ModelShape, ParallelConfig


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _hf_logits(hf_dir: Path, input_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).to(input_ids.device).eval()
    with torch.no_grad():
        return model(input_ids).logits.float()


PARITY_TEXTS = [
    "The quick brown fox jumps over the lazy dog, then naps for 25 minutes in the warm afternoon sun.",
    "def add(a, b):\n    return a + b  # Megatron and transformers must agree on every logit here.",
]


def parity_input_ids(hf_dir: str, length: int = 20) -> torch.Tensor:
    """Real token ids: fixed texts through the checkpoint's own tokenizer, cut to a common length."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"][:length] for text in PARITY_TEXTS]
    assert all(len(i) == length for i in ids), "parity texts are too short for this tokenizer"
    return torch.tensor(ids)


def _is_writer(parallel_state) -> bool:
    return parallel_state.is_pipeline_last_stage() and parallel_state.get_tensor_model_parallel_rank() == 0


def logit_parity(out_dir: str, hf_dirs: dict, parallel: ParallelConfig, ckpt_dirs: dict | None = None,
                 dtype: torch.dtype = torch.float32, attention: str | None = None) -> None:
    """Max |Megatron - HF| logits for each family, weights from HF files or from torch_dist checkpoints.

    Both models run in ``dtype``; below fp32 each is also compared with HF in fp32, so the test can hold
    Megatron's rounding error to the size of HF's own.
    """
    from megatron.core import parallel_state

    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.trainer.checkpoint import load_model_checkpoint
    from vime_ext.trainer.forward import forward_logits
    from vime_ext.trainer.hf_weights import load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    init_distributed(parallel)
    results = {}
    for family, hf_dir in hf_dirs.items():
        shape = ModelShape.from_hf_dir(hf_dir)
        model = build_gpt_model(shape, parallel, dtype=dtype, init_weights=ckpt_dirs is not None,
                                attention=attention)
        if ckpt_dirs:
            load_model_checkpoint(model, ckpt_dirs[family])
        else:
            load_hf_weights(model, shape, HFCheckpointReader(hf_dir).get)
        input_ids = parity_input_ids(hf_dir)
        logits = forward_logits(model, shape, input_ids.to(_device()))
        if _is_writer(parallel_state):
            logits = logits.float()
            ref = _hf_logits(Path(hf_dir), input_ids.to(_device()), dtype)
            exact = ref if dtype == torch.float32 else _hf_logits(Path(hf_dir), input_ids.to(_device()),
                                                                   torch.float32)
            results[family] = {"max_abs_diff": (logits - ref).abs().max().item(),
                               "max_abs_err": (logits - exact).abs().max().item(),
                               "hf_max_abs_err": (ref - exact).abs().max().item(),
                               "shape_equal": list(logits.shape) == list(ref.shape)}
    if _is_writer(parallel_state):
        Path(out_dir, "parity.json").write_text(json.dumps(results))
    destroy_distributed()


def train_step(out_dir: str, hf_dir: str, parallel: ParallelConfig) -> None:
    """Loss on a fixed batch before and after a few fwd+bwd+AdamW steps of the Megatron model."""
    from megatron.core import parallel_state

    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.trainer.hf_weights import load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    init_distributed(parallel)
    shape = ModelShape.from_hf_dir(hf_dir)
    model = build_gpt_model(shape, parallel)
    load_hf_weights(model, shape, HFCheckpointReader(hf_dir).get)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    tokens = parity_input_ids(hf_dir, length=17).to(_device())
    input_ids, labels = tokens[:, :-1], tokens[:, 1:]
    position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, labels=labels).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if _is_writer(parallel_state):
        Path(out_dir, "train.json").write_text(json.dumps({"losses": losses}))
    destroy_distributed()


def greedy_continuations(out_dir: str, hf_dir: str, ckpt_dir: str, prompts: list[list[int]], steps: int) -> None:
    """Greedy tokens from the Megatron model loaded from a torch_dist checkpoint."""
    from vime_ext.trainer.checkpoint import load_model_checkpoint
    from vime_ext.trainer.forward import greedy_generate
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    parallel = ParallelConfig()
    init_distributed(parallel)
    shape = ModelShape.from_hf_dir(hf_dir)
    model = build_gpt_model(shape, parallel, init_weights=False)
    load_model_checkpoint(model, ckpt_dir)
    results = [greedy_generate(model, shape, prompt, steps) for prompt in prompts]
    Path(out_dir, "greedy.json").write_text(json.dumps(results))
    destroy_distributed()


def sequence_log_probs(out_dir: str, hf_dir: str, sequences: list[tuple[list[int], int]],
                       temperature: float = 1.0) -> None:
    """Megatron log-probs of each (tokens, response start) at ``temperature``, weights loaded from the HF
    checkpoint."""
    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.trainer.forward import token_log_probs
    from vime_ext.trainer.hf_weights import load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    parallel = ParallelConfig()
    init_distributed(parallel)
    shape = ModelShape.from_hf_dir(hf_dir)
    model = build_gpt_model(shape, parallel, init_weights=False)
    load_hf_weights(model, shape, HFCheckpointReader(hf_dir).get)
    results = [token_log_probs(model, shape, tokens, start, temperature).tolist() for tokens, start in sequences]
    Path(out_dir, "log_probs.json").write_text(json.dumps(results))
    destroy_distributed()


def perturb_push_and_score(out_dir: str, hf_dir: str, engine_url: str, prompts: list[list[int]]) -> None:
    """The trainer's side of a weight update: perturb the Megatron weights, push them through
    ``iter_hf_weights`` into the engine, generate with the engine, and score the same tokens with Megatron."""
    import asyncio

    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.engines.client import RolloutClient
    from vime_ext.engines.protocol import SamplingParams
    from vime_ext.engines.weight_sync import WeightSync
    from vime_ext.trainer.forward import token_log_probs
    from vime_ext.trainer.hf_weights import iter_hf_weights, load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    parallel = ParallelConfig()
    init_distributed(parallel)
    shape = ModelShape.from_hf_dir(hf_dir)
    model = build_gpt_model(shape, parallel, init_weights=False)
    load_hf_weights(model, shape, HFCheckpointReader(hf_dir).get)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    sync = WeightSync([engine_url], bucket_bytes=32 * 2**20)  # several buckets
    sync.init()
    sent = sync.push(iter_hf_weights(model, shape), version=1)
    versions = sync.versions()
    sync.close()

    async def generate_all():
        client = RolloutClient(engine_url)
        try:
            greedy = await client.generate(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=10))
            sampled = await asyncio.gather(*(client.generate(p, SamplingParams(max_new_tokens=16)) for p in prompts))
            return greedy, sampled
        finally:
            await client.close()

    greedy, sampled = asyncio.run(generate_all())
    diffs = []
    for prompt, result in zip(prompts, sampled):
        ours = token_log_probs(model, shape, prompt + result.token_ids, len(prompt))
        diffs += (ours - torch.tensor(result.log_probs)).abs().tolist()
    Path(out_dir, "weight_update.json").write_text(json.dumps(
        {"sent": sent, "versions": versions, "greedy_after": greedy.token_ids, "diffs": diffs}))
    destroy_distributed()


def log_prob_paths_agree(out_dir: str, hf_dir: str, parallel: ParallelConfig) -> None:
    """Vocab-parallel log-probs (small chunks, so several per row) vs log-softmax of the gathered logits."""
    from megatron.core import parallel_state

    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.trainer.forward import forward_log_probs, forward_logits
    from vime_ext.trainer.hf_weights import load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    init_distributed(parallel)
    shape = ModelShape.from_hf_dir(hf_dir)
    model = build_gpt_model(shape, parallel, init_weights=False)
    load_hf_weights(model, shape, HFCheckpointReader(hf_dir).get)
    input_ids = parity_input_ids(hf_dir)
    sharded = forward_log_probs(model, shape, input_ids, chunk_tokens=7)
    logits = forward_logits(model, shape, input_ids)
    # Vocabulary padding: a shape whose vocab does not split evenly, so the last shard ends in padding columns.
    import dataclasses

    from vime_ext.models.model_config import padded_vocab_size
    from vime_ext.trainer.forward import vocab_parallel_log_probs

    tp = parallel.tensor_model_parallel_size
    odd = dataclasses.replace(shape, vocab_size=11 * tp - 1)
    shard = padded_vocab_size(odd, tp) // tp
    rows = torch.randn(5, shard * tp, generator=torch.Generator().manual_seed(1))
    rank = parallel_state.get_tensor_model_parallel_rank()
    targets = torch.tensor([0, 3, 7, odd.vocab_size - 1, 5])
    padded_lp = vocab_parallel_log_probs(rows[:, rank * shard:(rank + 1) * shard].clone(), targets, odd)
    expected = torch.log_softmax(rows[:, :odd.vocab_size], -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if _is_writer(parallel_state):
        full = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        Path(out_dir, "log_probs.json").write_text(json.dumps(
            {"max_abs_diff": (sharded - full).abs().max().item(), "shape": list(sharded.shape),
             "padded_vocab_diff": (padded_lp - expected).abs().max().item()}))
    destroy_distributed()


def rl_sequences(vocab: int, count: int = 8, seed: int = 0):
    """Random training sequences (fixed seed): varied lengths, partial loss masks, advantages of both signs,
    rewards 0 and 1 (for PPO)."""
    from vime_ext.algorithms.train_data import TrainSequence

    g = torch.Generator().manual_seed(seed)
    sequences = []
    for i in range(count):
        n = int(torch.randint(6, 14, (1,), generator=g))
        prompt = int(torch.randint(2, 4, (1,), generator=g))
        tokens = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * (prompt - 1) + [1] * (n - prompt)
        sequences.append(TrainSequence(tokens, mask, [-5.0] * (n - 1), float(torch.randn(1, generator=g)), i,
                                       reward=float(i % 3 == 0)))
    return sequences


def _rank_actor(flags: list[str]):
    """This rank's TrainActor for ``flags`` (rank and rendezvous from the environment), its config and layout."""
    import os

    from vime_ext.arguments import parse_train_args
    from vime_ext.trainer.actor import TrainActor

    config = parse_train_args(flags)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    actor = TrainActor(config, rank, world, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                       local_rank=rank)
    return config, actor, actor.layout()


def _train_on(actor, config, layout, seed: int = 0, nan_advantage: bool = False):
    """One rollout of ``rl_sequences(seed)``, this rank's data-parallel share of it; ``nan_advantage`` gives
    the first sequence a NaN advantage, which makes every gradient NaN."""
    from vime_ext.driver.step import plan_steps

    sequences = rl_sequences(config.shape.vocab_size, seed=seed)
    if nan_advantage:
        sequences[0].advantage = math.nan
    samples = [type("S", (), {"index": s.sample_index})() for s in sequences]
    per_rank, totals = plan_steps(config, samples, sequences, layout.dp_size)
    return actor.train_rollout(per_rank[layout.dp_rank], totals)


def _hf_weights(model, shape) -> dict[str, torch.Tensor]:
    """This rank's weights of ``model`` under HF names, fp32 on the CPU."""
    from vime_ext.trainer.hf_weights import iter_hf_weights

    return {name: tensor.float().cpu() for name, tensor in iter_hf_weights(model, shape)}


def rl_step(out_dir: str, flags: list[str]) -> None:
    """Two optimizer steps of TrainActor on fixed sequences in the layout ``flags`` describe; writes the step
    statistics and the updated weights (HF names, from every pipeline stage)."""
    config, actor, layout = _rank_actor(flags)
    result = _train_on(actor, config, layout)
    actor.weights_ready()  # as a push or a save reads them
    weights = _hf_weights(actor.model, config.shape)
    if actor.critic is not None:  # the critic's trunk under "critic." names, its value head as "critic.value_head"
        from vime_ext.trainer.model_provider import unwrap

        critic = actor.critic.model
        weights.update({f"critic.{name}": tensor for name, tensor in _hf_weights(critic, config.shape).items()
                        if name != "lm_head.weight"})
        if layout.last_stage:
            weights["critic.value_head"] = unwrap(critic).output_layer.weight.detach().float().cpu()
    if layout.tp_rank == 0 and layout.dp_rank == 0:
        torch.save(weights, Path(out_dir, f"weights_pp{layout.pp_rank}.pt"))
    if result.reports:
        Path(out_dir, f"steps_dp{layout.dp_rank}.json").write_text(json.dumps(result.steps))
    actor.shutdown()


def one_step_rollout(out_dir: str, flags: list[str], separate_pass: bool) -> None:
    """One rank, one rollout trained in one optimizer step: the step's own forward gives the old log-probs, or
    (``separate_pass``) a forward-only pass over the rollout does, as for several steps; writes the statistics,
    the engine mismatch, which forward-only passes ran and the weights after the step."""
    import dataclasses

    config, actor, layout = _rank_actor(flags)
    if separate_pass:
        passes = actor._forward_only_passes
        actor._forward_only_passes = lambda batches, sequences, old=True: passes(batches, sequences, True)
    fill, policy_passes = actor._fill_log_probs, []

    def counted(batches, old=True):  # which forward-only passes ran: the policy's (old) and the reference's
        policy_passes.append(old)
        fill(batches, old)

    actor._fill_log_probs = counted
    result = _train_on(actor, config, layout)
    actor.weights_ready()
    torch.save(_hf_weights(actor.model, config.shape), Path(out_dir, "weights.pt"))
    Path(out_dir, "result.json").write_text(json.dumps(
        {"steps": result.steps, "mismatch": dataclasses.asdict(result.mismatch), "policy_passes": policy_passes}))
    actor.shutdown()


def resume_step(out_dir: str, flags: list[str], resume: bool) -> None:
    """One rank: either train a rollout, save, and train a second one, or (``resume``) load that save and train
    the second one; writes the second step's statistics and the weights after it (HF names)."""
    config, actor, layout = _rank_actor(flags)
    checkpoint = Path(out_dir, "checkpoint")
    if resume:
        actor.load(str(checkpoint))
    else:
        _train_on(actor, config, layout, seed=0)
        actor.save(str(checkpoint), 1, {})
    result = _train_on(actor, config, layout, seed=1)
    actor.weights_ready()
    weights = _hf_weights(actor.model, config.shape)
    tag = "resumed" if resume else "whole"
    if layout.tp_rank == 0 and layout.dp_rank == 0:
        torch.save(weights, Path(out_dir, f"{tag}_weights_pp{layout.pp_rank}.pt"))
    if result.reports:
        Path(out_dir, f"{tag}_steps_dp{layout.dp_rank}.json").write_text(json.dumps(result.steps))
    actor.shutdown()


def non_finite_step(out_dir: str, flags: list[str]) -> None:
    """One rank: a rollout whose gradients are NaN, then a clean one; writes both steps' statistics and how many
    weight tensors each changed."""
    config, actor, layout = _rank_actor(flags)

    def changed(before, after):
        return sum(not torch.equal(before[k], after[k]) for k in before)

    start = _hf_weights(actor.model, config.shape)
    poisoned = _train_on(actor, config, layout, nan_advantage=True).steps
    after_poisoned = _hf_weights(actor.model, config.shape)
    clean = _train_on(actor, config, layout).steps
    Path(out_dir, "non_finite.json").write_text(json.dumps({
        "steps": [*poisoned, *clean], "changed_by_poisoned": changed(start, after_poisoned),
        "changed_by_clean": changed(after_poisoned, _hf_weights(actor.model, config.shape))}))
    actor.shutdown()


def attention_kernels_agree(out_dir: str) -> None:
    """SDPAAttention vs megatron-core's DotProductAttention on the same q/k/v (GQA): causal without a mask,
    and with an explicit per-sequence mask (causal + key padding, as a padded batch needs). Then SDPAAttention
    on the two rows packed (THD, row 1 cut to 6 tokens) against its own padded output."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from vime_ext.models.model_config import transformer_config
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed
    from vime_ext.trainer.sdpa_attention import SDPAAttention

    parallel = ParallelConfig()
    init_distributed(parallel)
    shape = ModelShape("qwen3", 1, 64, 96, 4, 2, 16, 100, 64, 10000.0, 1e-6, False, False, True)
    config = transformer_config(shape, parallel)
    g = torch.Generator().manual_seed(0)
    s, b = 9, 2
    q = torch.randn(s, b, 4, 16, generator=g)
    k, v = torch.randn(s, b, 2, 16, generator=g), torch.randn(s, b, 2, 16, generator=g)
    q, k, v = (t.to(_device()) for t in (q, k, v))  # megatron's attention keeps its buffers on the current device
    results = {}
    for name, mask_type in (("causal", AttnMaskType.causal), ("padding_mask", AttnMaskType.padding)):
        ours = SDPAAttention(config, 1, mask_type, "self").eval()
        ref = DotProductAttention(config, 1, mask_type, "self").eval()
        mask = None
        if name == "padding_mask":  # row 1's last 3 keys are padding; True = not allowed (megatron's convention)
            mask = torch.ones(s, s).triu(1).bool().expand(b, 1, s, s).clone()
            mask[1, :, :, s - 3:] = True
            mask[1, :, s - 3:, :] = False  # padded queries may look anywhere (their outputs are ignored)
            mask[1, :, s - 3:, s - 3:] = True
            mask[1, :, s - 3:, 0] = False
            mask = mask.to(_device())
        with torch.no_grad():
            a, r = ours(q, k, v, mask, mask_type), ref(q, k, v, mask, mask_type)
        results[name] = {"max_abs_diff": (a - r).abs().max().item(), "shape": list(a.shape)}
    ours = SDPAAttention(config, 1, AttnMaskType.causal, "self").eval()
    lengths = [s, 6]
    cu = torch.tensor([0, s, s + 6], dtype=torch.int32, device=_device())
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s)
    packed = [torch.cat([t[:n, row] for row, n in enumerate(lengths)]) for t in (q, k, v)]  # [t, heads, d]
    with torch.no_grad():
        padded = ours(q, k, v, None, AttnMaskType.causal)
        out = ours(*packed, None, AttnMaskType.causal, packed_seq_params=params)
    expected = torch.cat([padded[:n, row] for row, n in enumerate(lengths)])
    results["packed"] = {"max_abs_diff": (out - expected).abs().max().item(), "shape": list(out.shape)}
    Path(out_dir, "attention.json").write_text(json.dumps(results))
    destroy_distributed()


def packed_matches_padded(out_dir: str, hf_dir: str, dtype_name: str) -> None:
    """Log-probs and parameter gradients of a few sequences of different lengths, right-padded (SDPA's causal
    mask) and packed (THD: varlen flash attention on CUDA in half precision, else a call per sequence), in
    ``dtype``; below fp32 both are also compared with the padded fp32 model."""
    from vime_ext.algorithms.train_data import TrainSequence
    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.trainer.batching import collate
    from vime_ext.trainer.forward import forward_log_probs, position_log_probs
    from vime_ext.trainer.hf_weights import load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.packing import model_inputs
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed
    from vime_ext.trainer.sdpa_attention import _varlen_attn

    parallel = ParallelConfig()
    init_distributed(parallel)
    shape = ModelShape.from_hf_dir(hf_dir)
    g = torch.Generator().manual_seed(3)
    sequences = [TrainSequence(torch.randint(0, shape.vocab_size, (n,), generator=g).tolist(), [1] * (n - 1),
                               [0.0] * (n - 1), 1.0, i) for i, n in enumerate([37, 5, 64, 20])]
    padded, packed = collate(sequences).to(_device()), collate(sequences, pack_multiple=1).to(_device())
    valid = padded.loss_mask > 0

    def run(dtype: torch.dtype, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        model = build_gpt_model(shape, parallel, dtype=dtype, init_weights=False, attention="sdpa")
        load_hf_weights(model, shape, HFCheckpointReader(hf_dir).get)
        log_probs = forward_log_probs(model, shape, batch.tokens, packing=batch.packing)
        model.train()
        logits = model(**model_inputs(batch.tokens, batch.packing))
        (position_log_probs(logits, batch.tokens, batch.packing, shape, 4096) * batch.loss_mask).sum().backward()
        grads = {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}
        return log_probs.float()[valid], grads

    def gaps(a, b) -> dict:
        (lp_a, grads_a), (lp_b, grads_b) = a, b
        scale = max(g.abs().max().item() for g in grads_b.values())
        return {"log_prob": (lp_a - lp_b).abs().max().item(),
                "grad_rel": max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_b) / scale}

    dtype = getattr(torch, dtype_name)
    ours, theirs = run(dtype, packed), run(dtype, padded)
    result = {"packed_vs_padded": gaps(ours, theirs), "tokens": int(valid.sum()),
              "varlen": _device().type == "cuda" and dtype != torch.float32 and _varlen_attn() is not None}
    if dtype != torch.float32:
        reference = run(torch.float32, padded)
        result.update(packed_vs_fp32=gaps(ours, reference), padded_vs_fp32=gaps(theirs, reference))
    Path(out_dir, "packed.json").write_text(json.dumps(result))
    destroy_distributed()


def handover_step(out_dir: str, flags: list[str], handover: bool) -> None:
    """One rank: train a rollout, then (``handover``) release the trainer's memory in colocated mode's two
    stages (all but the policy weights, then those) and restore it, then train a second rollout; writes the
    second step's statistics, the weights after it, and what the release left allocated."""
    config, actor, layout = _rank_actor(flags)
    _train_on(actor, config, layout, seed=0)
    report = {}
    if handover:
        weights = list(actor.model.parameters())
        # What the hand-over takes: the device's tensors (Adam's step counters and offloaded states stay on the
        # host), other than the policy weights' storages.
        device = weights[0].device.type
        weight_storages = {w.untyped_storage().data_ptr() for w in weights}

        def handed(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            return [t for t in tensors
                    if t.device.type == device and t.untyped_storage().data_ptr() not in weight_storages]

        tensors = actor.optimizer.handover_tensors()
        # The optimizers' own state (masters and moments that are not the weights themselves): off the device
        # until the next step needs it, not back with the rest (or, --no-offload-optimizer-state, never moved)
        state = handed(tensors.state + actor.critic.optimizer.handover_tensors().state)
        state_moves = config.cluster.offload_optimizer_state
        others = handed(tensors.kept + (tensors.state if state_moves else []) + list(actor.ref_model.parameters())
                        + list(actor.critic.model.parameters()))
        state_gb = sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in state}.values()) / 2**30
        first = actor.release_memory(keep_weights=True)
        report["weights_kept"] = all(w.untyped_storage().nbytes() > 0 for w in weights)
        report["others_released"] = all(t.untyped_storage().nbytes() == 0 for t in others)
        second = actor.release_memory()
        report["weights_released"] = all(w.untyped_storage().nbytes() == 0 for w in weights)
        report["released_gb"] = first["handover_gb"] + second["handover_gb"]
        report["restored_gb"] = actor.restore_memory()["handover_gb"]
        report["state_gb"] = state_gb
        report["state_away_after_restore"] = all(t.untyped_storage().nbytes() == 0 for t in state)
        report["state_in_place_throughout"] = not state_moves and all(t.untyped_storage().nbytes() > 0 for t in state)
        # A second round: the reference model's host copy is reused, not made again.
        third = actor.release_memory()
        actor.restore_memory()
        report["second_round_copied_gb"] = third["handover_copied_gb"]
        report["first_round_copied_gb"] = first["handover_copied_gb"] + second["handover_copied_gb"]
        # The first release froze the rank's start-up objects (memory_handover.collect_garbage); the collections'
        # seconds, for a reader (not asserted: a timing)
        report["start_up_frozen"] = gc.get_freeze_count() > 0
        report["collect_s"] = [r["handover_collect_s"] for r in (first, second, third)]
    result = _train_on(actor, config, layout, seed=1)
    if handover:  # the step put it back
        report["state_back_after_step"] = all(t.untyped_storage().nbytes() > 0 for t in state)
    tag = "handover" if handover else "plain"
    torch.save(_hf_weights(actor.model, config.shape), Path(out_dir, f"{tag}_weights.pt"))
    Path(out_dir, f"{tag}.json").write_text(json.dumps({"steps": result.steps, **report}))
    actor.shutdown()


SFT_CHATS = [
    [{"role": "system", "content": "Answer in a box."}, {"role": "user", "content": "What is 17 x 23?"},
     {"role": "assistant", "content": None,
      "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expr": "17*23"}}}]},
     {"role": "tool", "content": "391"}, {"role": "assistant", "content": "\\boxed{391}"}],
    [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
     {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Eleven, \\boxed{11}."}],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."}],
]


def sft_loss_step(out_dir: str, flags: list[str]) -> None:
    """One SFT step on ``SFT_CHATS`` (masked by the checkpoint's own chat template) in the layout ``flags``
    describe; writes the step's loss (each data-parallel rank its weighted share) and the training sequences."""
    from transformers import AutoTokenizer

    from vime_ext.agent.chat_mask import ChatMasker
    from vime_ext.agent.sample import Sample
    from vime_ext.algorithms.train_data import samples_to_train_data
    from vime_ext.rollout.sft_rollout import chat_sample
    from vime_ext.driver.step import plan_steps

    config, actor, layout = _rank_actor(flags)
    masker = ChatMasker(AutoTokenizer.from_pretrained(config.checkpoint.hf_checkpoint))
    samples = [chat_sample(Sample(prompt=chat, index=i, group_index=i), masker) for i, chat in enumerate(SFT_CHATS)]
    sequences = samples_to_train_data(config.plugin_args(), samples)
    per_rank, totals = plan_steps(config, samples, sequences, layout.dp_size)
    result = actor.train_rollout(per_rank[layout.dp_rank], totals)
    if result.reports:
        Path(out_dir, f"sft_dp{layout.dp_rank}.json").write_text(json.dumps(
            {"loss": result.steps[0]["loss"], "sequences": [[s.tokens, s.loss_mask] for s in sequences]}))
    actor.shutdown()


def colocated_push(out_dir: str, hf_dir: str, cases: list[dict], gpu_of_rank: list[int]) -> None:
    """Each case's colocated push from a real Megatron model (its trainer layout, TP gathers and pipeline
    broadcasts included) to the case's engines, with stand-in devices: rank r plays GPU ``gpu_of_rank[r]``, and
    its 'IPC handle' of a tensor is a copy of the tensor, so the engine can check what it would map."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from vime_ext.convert.hf_checkpoint import HFCheckpointReader
    from vime_ext.engines.weight_sync import WeightTarget
    from vime_ext.trainer.colocated_push import ColocatedPush
    from vime_ext.trainer.hf_weights import load_hf_weights
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    shape = ModelShape.from_hf_dir(hf_dir)
    posted = {}
    for case in cases:
        parallel = ParallelConfig(case["tp"], case["pp"])
        init_distributed(parallel)
        rank = dist.get_rank()
        gpu = f"GPU-{gpu_of_rank[rank]}"
        model = build_gpt_model(shape, parallel, init_weights=False)
        load_hf_weights(model, shape, HFCheckpointReader(hf_dir).get)
        target = WeightTarget(tuple(case["urls"]), "ipc", case["engine_tp"], 0,
                              tuple(tuple(r) for r in case["engine_ranks"]))
        push = ColocatedPush(target, rank, bucket_bytes=case["bucket_bytes"],
                             share=lambda tensor: (gpu, tensor.detach().clone()))
        posted[case["name"]] = push.send(model, shape)
        push.close()
        parallel_state.destroy_model_parallel()
    Path(out_dir, f"posted_{dist.get_rank()}.json").write_text(json.dumps(posted))
    destroy_distributed()
