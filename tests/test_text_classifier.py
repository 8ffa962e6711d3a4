from functools import partial

import lightning.pytorch as pl
import pytest
import torch

from laptrain.families.classifier.text_classification import TextClassificationDataModule
from laptrain.families.classifier.text_classifier import TextClassifierModule
from laptrain.families.classifier.tiny_bert import tiny_bert_classifier
from tests.conftest import TINY_BERT as BACKBONE
from tests.conftest import quiet_trainer, write_texts


def test_from_config_uses_the_data_vocabulary_and_labels():
    m = TextClassifierModule(
        num_labels=3, backbone=BACKBONE, label_names=["a", "b", "c"], vocab_size=123, pad_token_id=0
    )
    assert m.model.config.vocab_size == 123
    assert m.model.config.id2label == {0: "a", 1: "b", 2: "c"}
    logits = m(torch.randint(1, 123, (2, 7)), torch.ones(2, 7, dtype=torch.long))
    assert logits.shape == (2, 3)


def test_a_saved_folder_loads_through_the_same_path_as_a_hub_name(tmp_path):
    torch.manual_seed(0)
    original = tiny_bert_classifier(num_labels=2, vocab_size=99)
    original.save_pretrained(tmp_path / "tiny")
    m = TextClassifierModule(num_labels=2, pretrained=str(tmp_path / "tiny"))
    assert torch.equal(
        m.model.bert.embeddings.word_embeddings.weight,
        original.bert.embeddings.word_embeddings.weight,
    )
    # a different label count re-initialises only the head
    m4 = TextClassifierModule(num_labels=4, pretrained=str(tmp_path / "tiny"))
    assert m4.model.classifier.out_features == 4


def test_a_float16_checkpoint_trains_with_float32_master_weights(tmp_path):
    """transformers 5 loads a checkpoint in the dtype its config.json names (``dtype="auto"``):
    a half-precision hub checkpoint gave fp16 weights that AdamW then updated in fp16."""
    torch.manual_seed(0)
    original = tiny_bert_classifier(num_labels=2, vocab_size=99).half()
    original.save_pretrained(tmp_path / "tiny")
    m = TextClassifierModule(num_labels=2, pretrained=str(tmp_path / "tiny"))
    assert {p.dtype for p in m.model.parameters()} == {torch.float32}
    weight = m.model.bert.embeddings.word_embeddings.weight
    assert torch.equal(weight, original.bert.embeddings.word_embeddings.weight.float())


def test_offline_hub_name_or_missing_folder_fails_with_a_hint(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # read once at import: without it the lookup waited on the network's timeouts (46 s)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="hub name \\(offline\\?\\): set model.pretrained"):
        TextClassifierModule(num_labels=2, pretrained="nobody-here/no-such-model")
    with pytest.raises(ValueError, match="model.pretrained=.*missing-model does not exist"):
        TextClassifierModule(num_labels=2, pretrained=str(tmp_path / "missing-model"))


def test_one_label_or_no_backbone_is_refused():
    with pytest.raises(ValueError, match="label_column"):
        TextClassifierModule(num_labels=1, backbone=BACKBONE)
    with pytest.raises(ValueError, match="model.pretrained"):
        TextClassifierModule(num_labels=2)


def test_hyperparameters_are_plain_and_checkpoint_loadable(tmp_path):
    m = TextClassifierModule(num_labels=2, backbone=BACKBONE, vocab_size=50)
    torch.save({"hparams": dict(m.hparams)}, tmp_path / "h.pt")
    assert (
        torch.load(tmp_path / "h.pt", weights_only=True)["hparams"]["backbone"]["model_type"]
        == "bert"
    )


def test_gradient_checkpointing_option_switches_the_backbone_and_is_recorded():
    m = TextClassifierModule(
        num_labels=2, backbone=BACKBONE, vocab_size=50, gradient_checkpointing=True
    )
    assert m.model.is_gradient_checkpointing and m.hparams.gradient_checkpointing
    m.train()
    ids = torch.randint(1, 50, (2, 6))
    loss = m.model(
        input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1])
    ).loss
    loss.backward()
    assert m.model.classifier.weight.grad is not None


def test_the_tiny_classifier_learns_the_word_label_texts(tmp_path):
    # The texts' words give the label away: a working model, loss and optimizer get well above
    # chance (1/3) within 60 steps; a broken head, labels or backward stays at it. Measured on
    # CPU: val/acc 0.67 and val/loss 0.53 at 60 steps (0.67 / 1.02 already at 30).
    pl.seed_everything(0, verbose=False)
    data = TextClassificationDataModule(
        files={"train": str(write_texts(tmp_path / "t.csv"))},
        vocab_size=300,
        max_length=48,
        batch_size=16,
        cache_dir=str(tmp_path / "cache"),
    )
    data.setup()
    model = TextClassifierModule(
        backbone={**BACKBONE, "hidden_dropout_prob": 0.0},
        optimizer=partial(torch.optim.AdamW, lr=3e-3),
        warmup_ratio=0.0,
        **data.model_kwargs(),
    )
    trainer = quiet_trainer(max_steps=60, check_val_every_n_epoch=1000, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    (metrics,) = trainer.validate(model, datamodule=data, verbose=False)
    assert metrics["val/acc"] > 0.5 and metrics["val/loss"] < 0.8
