import torch

from laptrain.data.collate import PadCollator


def test_pads_to_the_longest_in_the_batch_not_a_fixed_length():
    batch = PadCollator(pad_token_id=0)(
        [{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [8], "labels": 0}]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]


def test_pad_to_multiple_of_rounds_up():
    batch = PadCollator(pad_token_id=9, pad_to_multiple_of=8)([{"input_ids": [1] * 9}])
    assert batch["input_ids"].shape == (1, 16) and batch["input_ids"][0, -1] == 9
    assert "labels" not in batch
