import random

import pytest
import torch

from laptrain.data.sampler import LengthGroupedBatchSampler, ResumableDataLoader


def long_tailed(n=2000, seed=0):
    rng = random.Random(seed)
    return [min(512, int(rng.paretovariate(1.2) * 8)) for _ in range(n)]


def padded_tokens(sampler, lengths):
    return sum(max(lengths[i] for i in b) * len(b) for b in sampler.batches())


def test_every_index_once_and_order_depends_on_seed_and_epoch():
    lengths = long_tailed(500)
    s = LengthGroupedBatchSampler(lengths, 16, seed=3)
    first = s.batches()
    assert sorted(i for b in first for i in b) == list(range(500))
    assert s.batches() == first
    s.set_epoch(1)
    assert s.batches() != first
    assert LengthGroupedBatchSampler(lengths, 16, seed=4).batches() != first


def test_grouping_by_length_removes_most_padding():
    lengths = long_tailed()
    grouped = padded_tokens(LengthGroupedBatchSampler(lengths, 16), lengths)
    random_batches = padded_tokens(LengthGroupedBatchSampler(lengths, 16, mega_batches=0), lengths)
    real = sum(lengths)
    assert (grouped - real) < 0.25 * (random_batches - real)


def test_eval_order_is_longest_first_and_complete():
    lengths = [3, 9, 1, 7, 5]
    s = LengthGroupedBatchSampler(lengths, 2, shuffle=False)
    assert s.batches() == [[1, 3], [4, 0], [2]]


def test_batch_size_zero_is_refused_with_the_option():
    with pytest.raises(ValueError, match="hardware.batch_size"):
        LengthGroupedBatchSampler([1, 2], 0)


def make_loader(lengths):
    data = [{"x": i} for i in range(len(lengths))]
    return ResumableDataLoader(
        data,
        batch_sampler=LengthGroupedBatchSampler(lengths, 8, seed=1),
        collate_fn=lambda rows: [r["x"] for r in rows],
    )


def test_restored_loader_serves_exactly_the_rest_of_the_epoch():
    lengths = long_tailed(200)
    full = list(make_loader(lengths))
    loader = make_loader(lengths)
    it = iter(loader)
    seen = [next(it) for _ in range(7)]
    state = loader.state_dict()
    assert state["served"] == 7
    restored = make_loader(lengths)
    restored.load_state_dict(state)
    rest = list(restored)
    assert seen + rest == full
    # the next epoch starts from its beginning again
    assert len(list(restored)) == len(full)


def test_state_at_epoch_end_resumes_at_next_epoch_start():
    lengths = long_tailed(64)
    loader = make_loader(lengths)
    list(loader)
    restored = make_loader(lengths)
    restored.load_state_dict(loader.state_dict())
    assert len(list(restored)) == len(loader)


def test_loader_refuses_other_samplers():
    with pytest.raises(TypeError):
        ResumableDataLoader(list(range(4)), batch_size=2)


def test_torch_generator_is_private_to_the_sampler():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    LengthGroupedBatchSampler(long_tailed(100), 8).batches()
    assert torch.rand(1) == expected


def test_lightning_advances_the_epoch_of_the_batch_order():
    from lightning.fabric.utilities.data import _set_sampler_epoch

    loader = make_loader(long_tailed(64))
    first = list(loader)
    _set_sampler_epoch(loader, 1)
    assert loader.batch_sampler.epoch == 1
    assert list(loader) != first


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n", [200, 197, 34])
def test_ranks_split_each_global_batch_of_one_process(shuffle, n):
    """2 ranks x batch 8 get, step by step, the examples 1 rank x batch 16 gets: disjoint, the
    whole split, as many steps on each rank."""
    lengths = long_tailed(n)
    one = LengthGroupedBatchSampler(lengths, 16, seed=5, shuffle=shuffle)
    ranks = [
        LengthGroupedBatchSampler(lengths, 8, seed=5, shuffle=shuffle, replicas=2, rank=r)
        for r in (0, 1)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(one) == len(ranks[0].batches())
    for whole, a, b in zip(one.batches(), *(r.batches() for r in ranks), strict=True):
        assert a and b and not set(a) & set(b)
        assert sorted(a + b) == sorted(whole)
        assert abs(len(a) - len(b)) <= 1


def test_fewer_examples_than_ranks_repeat_rather_than_leave_a_rank_empty():
    parts = [
        LengthGroupedBatchSampler([5, 3, 4], 2, shuffle=False, replicas=4, rank=r).batches()
        for r in range(4)
    ]
    assert [len(p) for p in parts] == [1, 1, 1, 1]  # one step on every rank
    assert sorted(i for p in parts for b in p for i in b) == [0, 0, 1, 2]  # index 0 twice


def test_a_sampler_rebuilt_by_lightning_is_refused_with_the_option():
    from torch.utils.data import DistributedSampler

    rebuilt = DistributedSampler(list(range(10)), num_replicas=2, rank=0, shuffle=False)
    with pytest.raises(ValueError, match="trainer.use_distributed_sampler=false"):
        LengthGroupedBatchSampler(rebuilt, batch_size=4, drop_last=False)
