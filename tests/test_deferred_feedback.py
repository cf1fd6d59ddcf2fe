"""Feedback learnt one batch later (``defer_feedback``): the loop does not wait for the
step, and nothing handed back is lost, changed or taken twice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import hotset
from hotset.checkpoint import from_safe
from hotset.errors import ConfigError

N = 96

DEVICES = [
    pytest.param("cpu", True, id="cpu-forced"),
    pytest.param("cuda", None, id="cuda-auto", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device")),
]  # fmt: skip


def shade_loader(defer: bool | None, batch_size: int = 8):
    x, y = torch.randn(N, 1, 4, 4), torch.arange(N) % 3
    return hotset.make_loader(
        hotset.from_dataset(TensorDataset(x, y)), batch_size=batch_size, system="shade",
        cache_fraction=0.3, store="memory", num_workers=0, defer_feedback=defer,
    )  # fmt: skip


def naming(ids: torch.Tensor, device: str) -> torch.Tensor:
    """A loss that names its sample."""
    return (ids.double() / 100 + 1).to(device)


@pytest.mark.parametrize(("device", "defer"), DEVICES)
def test_a_deferred_batch_is_learnt_when_the_next_ones_feedback_comes(device, defer):
    """Each batch's losses reach the score board when the next batch's feedback comes,
    exactly as handed back (a caller that reuses its tensor afterwards changes nothing),
    and the epoch's last batch before the epoch ends; nothing is learnt twice."""
    with shade_loader(defer) as loader:
        board = loader.planner.sampler.board
        for epoch in range(2):
            loader.set_epoch(epoch)
            served, given = [], board.scores_given
            for _, _, ids in loader:
                losses = naming(ids, device)
                loader.feedback(ids, losses)
                losses.fill_(-1.0)  # the caller's buffer, reused
                if served:  # the batch before is learnt now, as handed back
                    last = served[-1].numpy()
                    assert board.seen[last].all()
                    assert np.allclose(board.loss[last], last / 100 + 1)
                if epoch == 0:  # this one is not yet (its ids not served before)
                    earlier = np.concatenate([s.numpy() for s in served] or [[]])
                    assert not board.seen[np.setdiff1d(ids.numpy(), earlier)].any()
                served.append(ids)
            everything = torch.cat(served).numpy()
            assert board.seen[everything].all()  # the last batch's too, at the epoch's end
            assert np.allclose(board.loss[everything], everything / 100 + 1)
            assert board.scores_given - given == everything.size  # each batch once


def test_without_deferral_each_batch_is_learnt_at_once():
    with shade_loader(False) as loader:
        board = loader.planner.sampler.board
        loader.set_epoch(0)
        for _, _, ids in loader:
            loader.feedback(ids, naming(ids, "cpu"))
            assert board.seen[ids.numpy()].all()


def test_a_deferred_bad_loss_is_named_and_the_batch_after_it_is_kept():
    """A wrong count is refused at the call; a NaN of a deferred batch is named (the
    sample) when the next batch's feedback comes, and that next batch is still learnt."""
    with shade_loader(True) as loader:
        board = loader.planner.sampler.board
        loader.set_epoch(0)
        batches = iter(loader)
        _, _, first = next(batches)
        with pytest.raises(ConfigError, match="7 losses for 8 ids"):
            loader.feedback(first, naming(first, "cpu")[:7])
        bad = naming(first, "cpu")
        bad[2] = float("nan")
        loader.feedback(first, bad)  # taken: its values are checked when learnt
        _, _, second = next(batches)
        with pytest.raises(ConfigError, match=f"first: sample {int(first[2])}"):
            loader.feedback(second, naming(second, "cpu"))
        assert not board.seen[np.setdiff1d(first.numpy(), second.numpy())].any()
        loader.state_dict()  # learns what is deferred: the batch after the bad one
        assert board.seen[second.numpy()].all()
        batches.close()


def test_a_deferred_batch_is_in_the_saved_state():
    """``state_dict`` learns the deferred batch first: a state saved mid-epoch holds
    every batch fed back, as one saved without deferral does."""
    boards, served = [], []
    for defer in (True, False):
        with shade_loader(defer) as loader:
            loader.set_epoch(0)
            ids_ = []
            for k, (_, _, ids) in enumerate(loader):
                loader.feedback(ids, naming(ids, "cpu"))
                ids_.append(ids.numpy())
                if k == 3:
                    state = from_safe(loader.state_dict())
                    break
        boards.append(state["planner"]["sampler"]["board"])
        served.append(np.concatenate(ids_))
    np.testing.assert_array_equal(served[0], served[1])  # (the first plans do not differ)
    deferred, at_once = boards
    assert deferred.seen[served[0]].all() and deferred.seen.sum() == at_once.seen.sum()
    np.testing.assert_array_equal(deferred.loss, at_once.loss)
    assert deferred.scores_given == at_once.scores_given == served[0].size


def test_the_accuracy_report_and_a_new_epoch_learn_the_deferred_batch_first():
    for end in ("report_accuracy", "set_epoch", "iter"):
        with shade_loader(True) as loader:
            board = loader.planner.sampler.board
            loader.set_epoch(0)
            batches = iter(loader)
            _, _, ids = next(batches)
            loader.feedback(ids, naming(ids, "cpu"))
            assert not board.seen.any()
            batches.close()  # the epoch left early
            if end == "report_accuracy":
                loader.report_accuracy(0.5)
            elif end == "set_epoch":
                loader.set_epoch(1)
            else:
                next(iter(loader))
            assert board.seen[ids.numpy()].all(), end
