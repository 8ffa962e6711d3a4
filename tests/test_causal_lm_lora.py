"""CausalLMLoRAModule: gradients with checkpointing, step-level loss normalisation, adapter-only
checkpoints, adapter folders, reload/merge exactness and one-line refusals (issue 12, items 3-5,
7, 8)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from laptrain.families.lora.causal_lm import (
    FINGERPRINT_KEY,
    CausalLMLoRAModule,
    refuse_precision,
)
from laptrain.families.lora.chat_tokenizer import offline_tokenizer
from laptrain.families.lora.instructions import IGNORE, encode_chat
from laptrain.families.lora.tiny_llama import tiny_llama_config

PAIRS = [
    ("What does `json.dumps` do?", "Serialize obj to a JSON formatted str."),
    ("What does `os.getcwd` do?", "Return a string representing the current working directory."),
    ("What does `math.sqrt` do?", "Return the square root of x."),
    ("What does `shutil.copy` do?", "Copy data and mode bits."),
    ("What does `re.compile` do?", "Compile a regular expression pattern."),
    ("What does `heapq.heappush` do?", "Push item onto heap, maintaining the heap invariant."),
    ("What does `random.choice` do?", "Choose a random element from a non-empty sequence."),
    ("What does `textwrap.dedent` do?", "Remove any common leading whitespace."),
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models on shared cores: one thread is several times faster than two (measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return offline_tokenizer(tmp_path_factory.mktemp("cache"))


def save_base(tokenizer, folder: Path, seed: int = 0, hidden: int = 64, **kw) -> str:
    """A random tiny Llama (initializer_range 0.3) saved with save_pretrained."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_llama_config(
        tokenizer,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        max_position_embeddings=256,
        **kw,
    )
    LlamaForCausalLM(config).save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def base(tokenizer, tmp_path_factory):
    return save_base(tokenizer, tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def calm_base(tokenizer, tmp_path_factory):
    """Llama's usual initializer_range 0.02: at 0.3 the random net amplifies float32 rounding of
    merged vs unmerged weights to ~4e-5 in logits of ~11 (measured), whatever the adapter."""
    return save_base(tokenizer, tmp_path_factory.mktemp("calm"), initializer_range=0.02)


def examples(tokenizer, pairs=PAIRS) -> list[dict[str, list[int]]]:
    rows = []
    for prompt, response in pairs:
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        ids, labels, _ = encode_chat(tokenizer, messages)
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def collate(pad_id: int):
    def fn(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad_id)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, IGNORE)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), 1
            labels[i, :n] = torch.tensor(r["labels"])
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": labels,
            "num_response_tokens": (labels != IGNORE).sum(),
        }

    return fn


def loader(tokenizer, rows, batch_size: int) -> DataLoader:
    return DataLoader(rows, batch_size=batch_size, collate_fn=collate(tokenizer.pad_token_id))


def trainer(root: Path, **kw) -> pl.Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=str(root),
    )
    options.update(kw)
    return pl.Trainer(**options)


def sgd(params):
    return torch.optim.SGD(params, lr=0.5)


def lora_weights(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


# ----- the output head on response positions only ------------------------------------------
def test_head_on_response_positions_gives_the_full_heads_loss_and_gradients(
    tokenizer, base, monkeypatch
):
    """The loss runs the output head on response positions only (response_head); the loss and every
    adapter gradient equal those of the full forward, which computes logits at every position."""
    from laptrain.families.lora import causal_lm as causal_lm_lora

    batch = collate(tokenizer.pad_token_id)(examples(tokenizer)[:4])
    results = {}
    for short in (True, False):
        if not short:
            monkeypatch.setattr(causal_lm_lora, "response_head", lambda model: None)
        torch.manual_seed(1)
        module = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 8})
        module.train()
        assert (causal_lm_lora.response_head(module.model) is not None) is short
        torch.manual_seed(2)  # the same dropout masks in both passes
        total, count = module._loss_sum(batch)
        total.backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        results[short] = (float(total), count, grads)
    (loss, count, grads), (full_loss, full_count, full_grads) = results[True], results[False]
    assert count == full_count == int((batch["labels"][:, 1:] != IGNORE).sum())
    assert abs(loss - full_loss) <= 1e-4 * abs(full_loss)
    assert grads.keys() == full_grads.keys() and len(grads) == 2 * 2 * 7
    for name, grad in grads.items():  # float32 rounding: the paths sum in different orders
        assert (grad - full_grads[name]).norm() <= 1e-5 * full_grads[name].norm(), name


def test_the_rows_shared_prefix_runs_once_with_the_same_loss_and_gradients(
    tokenizer, base, monkeypatch
):
    """The positions every row shares before its first loss (the chat template's header and "What
    does `") go through the decoder once for the batch; the loss and every adapter gradient equal
    those of the rows run whole."""
    from laptrain.families.lora import causal_lm as causal_lm_lora

    batch = collate(tokenizer.pad_token_id)(examples(tokenizer)[:4])
    start = causal_lm_lora.shared_prefix(batch)
    assert start >= 5
    results = {}
    for share in (True, False):
        if not share:
            monkeypatch.setattr(causal_lm_lora, "shared_prefix", lambda batch: 0)
        torch.manual_seed(1)
        module = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 8, "dropout": 0.0})
        module.train()
        seen: list[int] = []  # the positions the decoder embeds
        embeddings = module.model.get_input_embeddings()
        embeddings.register_forward_hook(partial(count_positions, seen))
        total, count = module._loss_sum(batch)
        total.backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        results[share] = (float(total), count, sum(seen), grads)
    (loss, count, positions, grads), (whole, whole_count, all_positions, whole_grads) = (
        results[True],
        results[False],
    )
    assert all_positions == batch["input_ids"].numel()
    assert positions == all_positions - 3 * start
    assert count == whole_count and abs(loss - whole) <= 1e-6 * abs(whole)
    assert grads.keys() == whole_grads.keys() and len(grads) == 2 * 2 * 7
    for name, grad in grads.items():  # float32 rounding (1e-6 measured; 3e-8 in float64)
        assert (grad - whole_grads[name]).norm() <= 1e-5 * whole_grads[name].norm(), name


def count_positions(seen: list[int], module, args, out: torch.Tensor) -> None:
    seen.append(out.shape[:2].numel())


def test_shared_prefix_stops_at_padding_a_loss_or_a_different_token():
    from laptrain.families.lora.causal_lm import shared_prefix

    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [1, 2, 3, 9, 5, 6]])
    labels = torch.full_like(ids, IGNORE)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1] * 6])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    assert shared_prefix(batch) == 3  # position 3 differs
    labels[1, 3] = 7  # position 2 predicts a token with a loss
    assert shared_prefix(batch) == 2
    assert shared_prefix({**batch, "input_ids": ids[:1], "labels": labels[:1]}) == 0  # one row
    same = {"input_ids": ids[:1].repeat(2, 1), "labels": torch.full_like(ids, IGNORE)}
    assert shared_prefix(same) == 5  # one position is always left
    assert shared_prefix({**same, "attention_mask": mask[:1].repeat(2, 1)}) == 5
    assert shared_prefix({**same, "position_ids": torch.arange(6).repeat(2, 1)}) == 0  # packed


def test_architectures_that_change_logits_after_the_head_keep_the_full_forward():
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    from laptrain.families.lora.causal_lm import response_head

    small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, vocab_size=64)
    small |= dict(num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    llama = LlamaForCausalLM(LlamaConfig(**small))
    decoder, head = response_head(llama)
    assert decoder is llama.model and head is llama.lm_head
    assert response_head(Gemma2ForCausalLM(Gemma2Config(**small))) is None  # soft-capped logits


# ----- 3. gradient checkpointing ----------------------------------------------------------------
def test_checkpointing_gives_every_adapter_a_gradient_and_the_same_loss(tokenizer, base):
    batch = collate(tokenizer.pad_token_id)(examples(tokenizer)[:4])
    losses, grads = {}, {}
    for checkpointing in (False, True):
        torch.manual_seed(1)
        module = CausalLMLoRAModule(
            tokenizer, pretrained=base, lora={"r": 8}, gradient_checkpointing=checkpointing
        )
        module.train()
        opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
        seen: set[str] = set()
        run = []
        for _ in range(2):
            total, count = module._loss_sum(batch)
            (total / count).backward()
            run.append(float(total / count))
            seen |= {
                n
                for n, p in module.named_parameters()
                if p.grad is not None and p.grad.abs().sum() > 0
            }
            opt.step()
            opt.zero_grad()
        names = {n for n, p in module.named_parameters() if "lora_A" in n or "lora_B" in n}
        assert len(names) == 2 * 2 * 7  # 2 layers x q,k,v,o,gate,up,down x (A, B)
        assert names <= seen, sorted(names - seen)[:3]
        losses[checkpointing] = run
        grads[checkpointing] = module.model.base_model.model.is_gradient_checkpointing
    assert grads == {False: False, True: True}
    for off, on in zip(losses[False], losses[True]):
        assert abs(off - on) <= 1e-6


def preset_adamw(params):
    """The LoRA presets' optimizer (conf/model/smollm2_135m_lora.yaml)."""
    return torch.optim.AdamW(params, lr=5.0e-4, weight_decay=0.0)


# ----- 7. accumulation equivalence --------------------------------------------------------------
@pytest.mark.parametrize("optimizer", [sgd, preset_adamw], ids=["sgd", "preset-adamw"])
def test_micro_1_x_accumulation_8_equals_micro_8_x_accumulation_1(
    tokenizer, base, tmp_path, optimizer
):
    pairs = [(p, r * (1 + i % 3)) for i, (p, r) in enumerate(PAIRS)]  # 1x-3x response lengths
    rows = examples(tokenizer, pairs * 2)
    counts = [sum(x != IGNORE for x in r["labels"]) for r in rows]
    assert len(set(counts)) > 3  # a mean of per-batch means would differ
    after = {}
    for micro, accumulation in ((8, 1), (1, 8)):
        torch.manual_seed(3)
        module = CausalLMLoRAModule(
            tokenizer, pretrained=base, optimizer=optimizer, save_adapters=False
        )
        fit = trainer(tmp_path / f"m{micro}", max_steps=2, accumulate_grad_batches=accumulation)
        fit.fit(module, train_dataloaders=loader(tokenizer, rows, micro))
        assert fit.global_step == 2
        after[micro] = lora_weights(module)
    moved = 0
    for name, w8 in after[8].items():
        w1 = after[1][name]
        if optimizer is sgd:  # the update is the gradient: equal to float rounding
            scale = max(float(w8.abs().max()), 1e-12)
            assert float((w8 - w1).abs().max()) / scale <= 1e-5, name
        else:  # Adam divides by the gradient's own size, so rounding shows more: measured 2.4e-8
            assert float((w8 - w1).abs().max()) <= 1e-3 * 5.0e-4, name  # 0.1 % of one step (lr)
        moved += int(w8.abs().sum() > 0)
    assert moved == len(after[8])


# ----- 5. adapter-only checkpoints, adapter folders, resume checks ------------------------------
def test_checkpoint_holds_only_adapters_and_refuses_another_base(tokenizer, base, tmp_path):
    rows = examples(tokenizer)
    torch.manual_seed(0)
    module = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 8})
    save = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    fit = trainer(tmp_path, max_steps=3, enable_checkpointing=True, callbacks=[save])
    fit.fit(module, train_dataloaders=loader(tokenizer, rows, 4))

    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    last = tmp_path / "ckpt" / "last.ckpt"
    assert last.stat().st_size <= 3 * 4 * trainable + 256 * 1024
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert set(state["state_dict"]) == module.trainable_keys()
    assert state["laptrain_base_fingerprint"]["config_sha256"]

    folders = sorted(p.name for p in (tmp_path / "adapters").iterdir())
    assert folders == ["step-000002", "step-000003"]  # the last 2 are kept
    step = tmp_path / "adapters" / "step-000003"
    config = json.loads((step / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == Path(base)
    for name in ("adapter_model.safetensors", "tokenizer.json", "training_config.json"):
        assert (step / name).is_file(), name
    assert json.loads((step / "training_config.json").read_text())["global_step"] == 3

    # resume in a fresh module: the adapters come back from the file
    torch.manual_seed(5)
    again = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 8})
    resumed = trainer(tmp_path / "again", max_steps=4)
    resumed.fit(again, train_dataloaders=loader(tokenizer, rows, 4), ckpt_path=str(last))
    assert resumed.global_step == 4

    other = CausalLMLoRAModule(
        tokenizer, pretrained=save_base(tokenizer, tmp_path / "other", hidden=32), lora={"r": 8}
    )
    with pytest.raises(ValueError, match="another|same model.pretrained") as err:
        trainer(tmp_path / "other_run", max_steps=4).fit(
            other, train_dataloaders=loader(tokenizer, rows, 4), ckpt_path=str(last)
        )
    assert "was trained on base" in one_line(err)

    missing = dict(state)
    missing["state_dict"] = dict(list(state["state_dict"].items())[1:])
    with pytest.raises(ValueError, match="model.lora") as err:
        again.on_load_checkpoint(missing)
    one_line(err)


# ----- 4. reload and merge ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "variant", [{}, {"use_dora": True}, {"use_rslora": True}], ids=["lora", "dora", "rslora"]
)
def test_reloaded_adapter_is_exact_and_merged_matches(tokenizer, calm_base, tmp_path, variant):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from laptrain.families.lora.tools import export_merged

    torch.manual_seed(0)
    module = CausalLMLoRAModule(tokenizer, pretrained=calm_base, lora={"r": 8, **variant}).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name or "lora_magnitude" in name:
                p.add_(torch.randn_like(p) * 0.2)
    batch = collate(tokenizer.pad_token_id)(examples(tokenizer)[:4])
    with torch.no_grad():
        expected = module(batch["input_ids"], batch["attention_mask"])
        with module.model.disable_adapter():
            plain = module(batch["input_ids"], batch["attention_mask"])
    assert float((expected - plain).abs().max()) > 1e-2  # the adapter changes the logits
    module.export(tmp_path / "adapter")

    reloaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(calm_base), str(tmp_path / "adapter")
    ).eval()
    with torch.no_grad():
        got = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(got, expected)

    merged_dir = export_merged(tmp_path / "adapter", tmp_path / "merged")
    assert not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir)).eval()
    with torch.no_grad():
        out = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert float((out - expected).abs().max()) <= 1e-5


# ----- 8. one-line refusals ---------------------------------------------------------------------
def test_refusals_are_one_line(tokenizer, base, tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="model.quantization") as err:
            CausalLMLoRAModule(tokenizer, pretrained=base, quantization="4bit")
        assert "CUDA-only" not in one_line(err)

    with pytest.raises(ValueError, match="model.lora.target_modules") as err:
        CausalLMLoRAModule(tokenizer, pretrained=base, lora={"target_modules": ["no_such_proj"]})
    one_line(err)

    for precision in ("bf16-true", "16-true"):
        assert "32-true" in refuse_precision("cpu", precision)
    assert refuse_precision("cpu", "32-true") is None
    assert refuse_precision("cuda", "bf16-mixed") is None
    module = CausalLMLoRAModule(tokenizer, pretrained=base)
    with pytest.raises(ValueError, match="precision=bf16-true") as err:
        trainer(tmp_path, max_steps=1, precision="bf16-true").fit(
            module, train_dataloaders=loader(tokenizer, examples(tokenizer), 4)
        )
    one_line(err)

    with pytest.raises(ValueError, match="base_dtype"):
        CausalLMLoRAModule(tokenizer, pretrained=base, base_dtype="float8")


def test_bfloat16_base_keeps_float32_adapters(tokenizer, base):
    module = CausalLMLoRAModule(tokenizer, pretrained=base, base_dtype="bfloat16")
    dtypes = {p.dtype for p in module.parameters() if p.requires_grad}
    frozen = {p.dtype for p in module.parameters() if not p.requires_grad}
    assert dtypes == {torch.float32}
    assert frozen == {torch.bfloat16}
    batch = collate(tokenizer.pad_token_id)(examples(tokenizer)[:2])
    total, count = module._loss_sum(batch)
    total.backward()
    assert all(p.grad.dtype == torch.float32 for p in module.parameters() if p.grad is not None)


def test_packed_4d_mask_runs_in_the_base_dtype(tokenizer, base):
    from laptrain.families.lora.instructions import block_causal_mask

    module = CausalLMLoRAModule(tokenizer, pretrained=base, base_dtype="bfloat16").eval()
    rows = examples(tokenizer)[:2]
    ids = torch.tensor([rows[0]["input_ids"] + rows[1]["input_ids"]])
    mask, positions = block_causal_mask([[len(r["input_ids"]) for r in rows]], ids.shape[1])
    with torch.no_grad():
        packed = module(ids, mask, positions)
        alone = module(torch.tensor([rows[1]["input_ids"]]))
    n = len(rows[1]["input_ids"])
    assert float((packed[0, -n:].float() - alone[0].float()).abs().max()) < 0.1


def test_a_hub_name_that_cannot_be_reached_is_one_line_naming_the_fix(tokenizer, monkeypatch):
    """No network (HF_HUB_OFFLINE, an empty hub cache): `model=llama32_3b_lora` fails in one line
    naming model.pretrained, not with a hub traceback."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read at import: also set the parsed constant
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError) as err:
        CausalLMLoRAModule(tokenizer=tokenizer, pretrained="meta-llama/Llama-3.2-3B-Instruct")
    text = str(err.value)
    assert "\n" not in text and "hub name (offline?)" in text and "model.pretrained" in text


def test_step_pruning_spares_exports_and_a_resumed_runs_new_lower_steps(tokenizer, base, tmp_path):
    """Issue 48 item 5: only ``step-N`` folders of this run's lineage are pruned, numerically."""
    from types import SimpleNamespace

    from laptrain.families.lora.adapter_folders import default_export_dir, find_adapter

    root = tmp_path / "adapters"
    others = ["step-000100-gguf-q8_0", "step-000100-merged", "step-001000-notes"]
    for name in others:
        (root / name).mkdir(parents=True)
        (root / name / "keep.txt").write_text("not a step adapter")

    def write_steps(module, *steps):
        for step in steps:
            fake = SimpleNamespace(global_step=step, default_root_dir=str(tmp_path))
            module._write_step_adapter(fake, None)

    first = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 4})
    write_steps(first, 100, 999_999, 1_000_000, 1_000_001)
    # the two highest steps, counted as numbers; the exports and the user's folder stay
    assert sorted(p.name for p in root.iterdir()) == [*others, "step-1000000", "step-1000001"]
    assert find_adapter(tmp_path) == root / "step-1000001"
    assert default_export_dir(root / "step-1000001", "merged") == tmp_path / "step-1000001-merged"

    resumed = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 4})
    resumed.on_load_checkpoint(  # a resume from an earlier checkpoint, at step 500
        {
            FINGERPRINT_KEY: dict(resumed.fingerprint),
            "state_dict": dict.fromkeys(resumed.trainable_keys()),
            "global_step": 500,
        }
    )
    write_steps(resumed, 600, 700, 800)
    names = sorted(p.name for p in root.iterdir())
    assert "step-000700" in names and "step-000800" in names and "step-000600" not in names
    assert {"step-1000000", "step-1000001"} <= set(names)  # another lineage's: left alone
    for name in others:
        assert (root / name / "keep.txt").is_file(), name


@pytest.mark.parametrize("preset", ["tiny_llama_lora", "smollm2_135m_lora", "llama32_3b_lora"])
def test_the_lora_presets_step_adamw_fused(preset):
    """One fused kernel for all adapters (HF Trainer's default): the single-tensor loop took
    several element-wise kernels per adapter tensor, 420 tensors in SmolLM2 (docs/speed.md)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf" / "model" / f"{preset}.yaml"
    factory = instantiate(OmegaConf.load(conf).optimizer)
    assert factory([torch.nn.Parameter(torch.zeros(2))]).defaults["fused"] is True
